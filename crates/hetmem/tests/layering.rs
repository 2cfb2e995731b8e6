//! The layering rule of `DESIGN.md`, checked on the source tree: OS calls (`libc`, `rustix`,
//! `std::fs`) are made only in the two backend folders below the backend trait
//! (`src/backend/host/`, `src/backend/cuda/`) and in the Linux platform crate below them
//! (`crates/hetmem-linux`, which knows nothing of hetmem); no file outside the host backend's
//! folder names it, so that the cuda backend sits beside it as an equal; and the CLI reaches
//! hetmem through its public API only.
//! `src/backend/mod.rs` is the one place that makes the backends (`mod host;`,
//! `host::HostBackend::new`) and forwards the platform facts.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Lines of `files` (comments skipped) for which `bad` is true, as `path:line: text`.
fn offending(files: &[PathBuf], bad: impl Fn(&str) -> bool) -> Vec<String> {
    let mut hits = Vec::new();
    for f in files {
        for (i, l) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            let t = l.trim_start();
            if t.starts_with("//") {
                continue;
            }
            if bad(t) {
                hits.push(format!("{}:{}: {}", f.display(), i + 1, t));
            }
        }
    }
    hits
}

fn names_os(l: &str) -> bool {
    ["libc::", "rustix::", "std::fs::", "std::fs;", "use std::fs"]
        .iter()
        .any(|p| l.contains(p))
}

fn names_host_backend(l: &str) -> bool {
    l.contains("backend::host") || l.contains("hal::host") || l.contains("HostBackend")
}

#[test]
fn only_the_platform_folders_make_os_calls_and_only_the_host_folder_names_the_host_backend() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let host = src.join("backend").join("host");
    let platform = [host.clone(), src.join("backend").join("cuda")];
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let above: Vec<PathBuf> = files
        .iter()
        .filter(|f| !platform.iter().any(|p| f.starts_with(p)))
        .cloned()
        .collect();
    assert!(above.len() > 5, "the source tree was not found: {above:?}");
    let dispatch = src.join("backend").join("mod.rs");
    let hits = offending(&above, |l| names_os(l) || names_host_backend(l));
    let hits: Vec<String> = hits
        .into_iter()
        // The dispatch point may name the module it dispatches to, and nothing else.
        .filter(|h| !h.starts_with(&dispatch.display().to_string()) || names_os(h))
        .collect();
    assert!(
        hits.is_empty(),
        "host-backend names or OS calls above src/backend/host/:\n{}",
        hits.join("\n")
    );
    // The platform folders beside the host backend never name it either.
    let beside: Vec<PathBuf> = files
        .into_iter()
        .filter(|f| platform[1..].iter().any(|p| f.starts_with(p)))
        .collect();
    let hits = offending(&beside, names_host_backend);
    assert!(
        hits.is_empty(),
        "the cuda backend names the host backend:\n{}",
        hits.join("\n")
    );
}

/// The platform crate is below hetmem: it never depends on it or names its backends.
#[test]
fn the_linux_platform_crate_is_below_hetmem() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hetmem-linux");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        !manifest
            .lines()
            .any(|l| l.trim_start().starts_with("hetmem ")
                || l.trim_start().starts_with("hetmem=")
                || l.trim_start().starts_with("hetmem.")),
        "hetmem-linux depends on hetmem:\n{manifest}"
    );
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(
        !files.is_empty(),
        "the platform crate's sources were not found"
    );
    let hits = offending(&files, |l| l.contains("hetmem::") || names_host_backend(l));
    assert!(
        hits.is_empty(),
        "hetmem-linux names hetmem:\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_cli_uses_only_the_public_api_and_never_the_backend_module() {
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hetmem-cli/src");
    let mut files = Vec::new();
    rust_files(&cli, &mut files);
    assert!(!files.is_empty(), "the CLI sources were not found");
    let hits = offending(&files, |l| {
        l.contains("hetmem::backend") || l.contains("::host::")
    });
    assert!(
        hits.is_empty(),
        "the CLI reaches into the backend:\n{}",
        hits.join("\n")
    );
}

/// The semantics modules (`src/semantics/*.rs`) that module `m` names in its code (comments
/// and its `#[cfg(test)]` module left out).
fn semantics_imports(src: &Path, m: &str, all: &[String]) -> Vec<String> {
    let text = std::fs::read_to_string(src.join("semantics").join(format!("{m}.rs"))).unwrap();
    let code = text.split("#[cfg(test)]").next().unwrap();
    let mut out = Vec::new();
    for l in code.lines() {
        let t = l.trim_start();
        if t.starts_with("//") {
            continue;
        }
        for other in all {
            if other != m && t.contains(&format!("semantics::{other}")) && !out.contains(other) {
                out.push(other.clone());
            }
        }
    }
    out
}

#[test]
fn the_semantics_modules_import_each_other_without_a_cycle_and_never_the_api() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all: Vec<String> = std::fs::read_dir(src.join("semantics"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|m| m != "mod")
        .collect();
    all.sort();
    assert!(all.len() >= 8, "semantics modules not found: {all:?}");
    let graph: Vec<(String, Vec<String>)> = all
        .iter()
        .map(|m| (m.clone(), semantics_imports(&src, m, &all)))
        .collect();
    // Kahn's algorithm: repeatedly remove modules that import nothing left.
    let mut left = graph.clone();
    while let Some(i) = left
        .iter()
        .position(|(_, deps)| deps.iter().all(|d| !left.iter().any(|(m, _)| m == d)))
    {
        left.remove(i);
    }
    assert!(left.is_empty(), "import cycle among {left:?}");
    // Nothing in the semantics layer names the API above it.
    let mut files = Vec::new();
    rust_files(&src.join("semantics"), &mut files);
    let up = offending(&files, |l| {
        l.contains("crate::api") || l.contains("crate::Context") || l.contains("crate::Driver")
    });
    let up: Vec<String> = up.into_iter().filter(|h| !h.contains("[`")).collect();
    assert!(
        up.is_empty(),
        "the semantics layer names the API:\n{}",
        up.join("\n")
    );
}
