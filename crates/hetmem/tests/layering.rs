//! The layering rules of `DESIGN.md`, checked on the source tree:
//!
//! - OS calls (`libc`, `rustix`, `std::fs`) are made only in the two backend folders below the
//!   backend trait (`src/backend/host/`, `src/backend/cuda/`) and in the Linux platform crate
//!   below them (`crates/hetmem-linux`, which knows nothing of hetmem); above `src/backend/`
//!   (api, semantics, spec, error, config) not even the names `std::os` and `hetmem_linux`
//!   appear. No file outside the host backend's folder names it (so that the cuda backend sits
//!   beside it as an equal); `src/backend/mod.rs` is the one place that makes the backends
//!   (`mod host;`, `host::HostBackend::new`).
//! - `src/api/` (the builder's `runtime.rs` aside) is a thin front: it builds no spec `Error`
//!   (`Error::...`), takes no lock (`.read()`, `.write()`, `.lock()`), and never reaches the
//!   backend (`.backend`, the residency backend `.res`, `residency_error`): the semantics layer
//!   owns the driver's state and its locks.
//! - The C ABI crates (`hetmem-ze`, `hetmem-acl`) make no OS call (`libc` functions, `rustix`,
//!   `std::fs`, `std::os`, `hetmem_linux`): they translate onto the API (C types such as
//!   `libc::c_void` are fine).
//! - The CLI reaches hetmem through its public API only (and of the platform crate only its
//!   streaming copy, `hetmem_linux::copy`, a benchmark's raw baseline).
//! - The semantics modules import each other in the order of the table of
//!   `src/semantics/mod.rs`, one row per file (`ipc::format` is `semantics/ipc/format.rs`):
//!   each file imports only rows listed before it, whether by `crate::semantics::...`,
//!   `super::` / `self::` paths or the crate's re-export paths (`crate::ipc`, `crate::vmm`,
//!   ..., which a semantics file must not use), and never names the API.
//!
//! Each checker is a function over sources, and a self-test shows it flags a synthetic
//! violation. The sources are read at `HETMEM_REPO_ROOT` when it is set, else at the build path
//! (`CARGO_MANIFEST_DIR`), else (a packed test binary run on another machine, as
//! `scripts/gpu-suite` does) at the repository root containing the current directory; where
//! none is a checkout the tests fail saying where they looked.

use std::path::{Path, PathBuf};

// ------------------------------------------------------------------------------------------
// Finding and reading the sources.

/// Whether `root` is a checkout of this repository.
fn is_repo_root(root: &Path) -> bool {
    root.join("crates/hetmem/src/lib.rs").is_file()
        && root.join("crates/hetmem/src/semantics/mod.rs").is_file()
}

/// The repository root: `HETMEM_REPO_ROOT` when set (an explicit choice wins, e.g. to check
/// another checkout), else the build path, else the current directory or one of its parents;
/// panics saying where it looked.
fn repo_root() -> PathBuf {
    if let Some(r) = std::env::var_os("HETMEM_REPO_ROOT") {
        let r = PathBuf::from(r);
        assert!(
            is_repo_root(&r),
            "layering: HETMEM_REPO_ROOT={} is not a hetmem checkout (no crates/hetmem/src/lib.rs \
             and semantics/mod.rs there)",
            r.display()
        );
        return r;
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if is_repo_root(&built) {
        return built;
    }
    let mut tried = vec![
        "HETMEM_REPO_ROOT (not set)".to_string(),
        format!(
            "the build path {} (CARGO_MANIFEST_DIR/../..)",
            built.display()
        ),
    ];
    match std::env::current_dir() {
        Ok(cwd) => {
            if let Some(r) = cwd.ancestors().find(|a| is_repo_root(a)) {
                return r.to_path_buf();
            }
            tried.push(format!(
                "the current directory {} and its parents",
                cwd.display()
            ));
        }
        Err(e) => tried.push(format!("the current directory (unreadable: {e})")),
    }
    panic!(
        "layering: this test reads the hetmem sources and found none; tried {}. Run it from the \
         repository root, or set HETMEM_REPO_ROOT to a checkout of the commit it was built from.",
        tried.join(", ")
    );
}

/// One source file: its path (relative to the repository root, `/`-separated) and its code
/// lines (1-based numbers), with comments, string and character literal contents blanked and
/// `#[cfg(test)] mod ... { }` blocks removed.
#[derive(Debug, Clone)]
struct Src {
    path: String,
    lines: Vec<(usize, String)>,
}

impl Src {
    fn new(path: &str, text: &str) -> Src {
        Src {
            path: path.to_string(),
            lines: strip_test_modules(&code_only(text)),
        }
    }

    /// `path:line: text` for each code line where `bad` is true.
    fn hits(&self, bad: impl Fn(&str) -> bool) -> Vec<String> {
        self.lines
            .iter()
            .filter(|(_, l)| bad(l))
            .map(|(n, l)| format!("{}:{}: {}", self.path, n, l.trim()))
            .collect()
    }
}

/// `text` with comments removed and the contents of string and character literals blanked
/// (newlines kept, so line numbers stay).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if ch == 'r'
            && (next == Some('"') || next == Some('#'))
            && !c[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(ch);
                i += 1;
                continue;
            }
            out.push_str("\"\"");
            j += 1;
            loop {
                match c.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some('\n') => out.push('\n'),
                    _ => {}
                }
                j += 1;
            }
            i = j;
        } else if ch == '"' {
            out.push_str("\"\"");
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if c.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
        } else if ch == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(ch);
                i += 1;
            }
        } else {
            out.push(ch);
            i += 1;
        }
    }
    out
}

/// The numbered lines of `code` without its `#[cfg(test)] mod name { ... }` blocks.
fn strip_test_modules(code: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim();
        if t == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim().is_empty() {
                j += 1;
            }
            let m = lines.get(j).map(|l| l.trim()).unwrap_or("");
            let is_mod = m.starts_with("mod ")
                || m.starts_with("pub mod ")
                || m.starts_with("pub(crate) mod ")
                || m.starts_with("pub(super) mod ");
            if is_mod && m.ends_with('{') {
                let mut depth = 0i64;
                let mut k = j;
                while k < lines.len() {
                    depth += lines[k].matches('{').count() as i64;
                    depth -= lines[k].matches('}').count() as i64;
                    k += 1;
                    if depth <= 0 {
                        break;
                    }
                }
                i = k;
                continue;
            }
        }
        if !t.is_empty() {
            out.push((i + 1, lines[i].to_string()));
        }
        i += 1;
    }
    out
}

/// Every `.rs` file under `dir` (relative to `root`), read.
fn sources(root: &Path, dir: &str) -> Vec<Src> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(d)
            .unwrap_or_else(|e| panic!("layering: cannot read {}: {e}", d.display()));
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root.join(dir), &mut files);
    files.sort();
    let v: Vec<Src> = files
        .iter()
        .map(|f| {
            let rel = f
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            Src::new(&rel, &std::fs::read_to_string(f).unwrap())
        })
        .collect();
    assert!(!v.is_empty(), "layering: no sources under {dir}");
    v
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `pat` occurs in `l` not preceded by an identifier character (and, if `whole`, not
/// followed by one).
fn has_token(l: &str, pat: &str, whole: bool) -> bool {
    l.match_indices(pat).any(|(i, _)| {
        let before_ok = !l[..i].chars().next_back().is_some_and(is_ident);
        let after_ok = !whole || !l[i + pat.len()..].chars().next().is_some_and(is_ident);
        before_ok && after_ok
    })
}

fn fail_on(what: &str, hits: Vec<String>) {
    assert!(hits.is_empty(), "{what}:\n{}", hits.join("\n"));
}

// ------------------------------------------------------------------------------------------
// The checkers.

/// An OS call: `libc` / `rustix` / `std::fs`.
fn names_os_call(l: &str) -> bool {
    has_token(l, "libc::", false) || has_token(l, "rustix::", false) || l.contains("std::fs")
}

/// The platform's own names, which only the backend layer uses: `std::os`, `hetmem_linux`.
fn names_platform(l: &str) -> bool {
    l.contains("std::os") || has_token(l, "hetmem_linux", true)
}

fn names_host_backend(l: &str) -> bool {
    l.contains("backend::host") || l.contains("hal::host") || l.contains("HostBackend")
}

/// Where `crates/hetmem/src` files may make OS calls and name the host backend: OS calls only
/// in `backend/host/` and `backend/cuda/`; the host backend named only in `backend/host/` and
/// by `backend/mod.rs` (which makes it).
fn check_hetmem_os_calls(files: &[Src]) -> Vec<String> {
    let mut hits = Vec::new();
    for f in files {
        let rel = f.path.split("crates/hetmem/src/").nth(1).unwrap_or(&f.path);
        let in_host = rel.starts_with("backend/host/");
        if !in_host && !rel.starts_with("backend/cuda/") {
            hits.extend(f.hits(names_os_call));
        }
        if !in_host && rel != "backend/mod.rs" {
            hits.extend(f.hits(names_host_backend));
        }
    }
    hits
}

/// `std::os` and `hetmem_linux` only in the backend layer (`src/backend/`), never above it.
fn check_platform_names(files: &[Src]) -> Vec<String> {
    files
        .iter()
        .filter(|f| !f.path.contains("crates/hetmem/src/backend/"))
        .flat_map(|f| f.hits(names_platform))
        .collect()
}

/// A spec `Error` built (`Error::Variant(..)`, `Error::new`, `Error::from`).
fn builds_error(l: &str) -> bool {
    has_token(l, "Error::", false)
}

/// A lock taken.
fn takes_lock(l: &str) -> bool {
    [
        ".read()",
        ".write()",
        ".lock()",
        ".try_lock()",
        ".try_read()",
        ".try_write()",
        ".upgradable_read()",
    ]
    .iter()
    .any(|p| l.contains(p))
}

/// Whether `l` accesses field `.name` (`.backend`, not `.backend_kind`).
fn field(l: &str, dot_name: &str) -> bool {
    l.match_indices(dot_name)
        .any(|(i, _)| !l[i + dot_name.len()..].chars().next().is_some_and(is_ident))
}

/// The backend reached: the driver's backend, the residency backend, its error conversion.
fn reaches_backend(l: &str) -> bool {
    field(l, ".backend") || field(l, ".res") || has_token(l, "residency_error", true)
}

/// The thin-API rules over `src/api/*.rs` (the builder's `runtime.rs` aside): no spec `Error`
/// built, no lock taken, no backend reached.
fn check_api_thin(files: &[Src]) -> Vec<String> {
    let mut hits = Vec::new();
    for f in files.iter().filter(|f| !f.path.ends_with("/runtime.rs")) {
        hits.extend(
            f.hits(builds_error)
                .into_iter()
                .map(|h| format!("builds an Error: {h}")),
        );
        hits.extend(
            f.hits(takes_lock)
                .into_iter()
                .map(|h| format!("takes a lock: {h}")),
        );
        hits.extend(
            f.hits(reaches_backend)
                .into_iter()
                .map(|h| format!("reaches the backend: {h}")),
        );
    }
    hits
}

/// An OS call of a C ABI crate: a `libc` function or constant (its C types `libc::c_*` are
/// fine), `rustix`, `std::fs`, `std::os`, `hetmem_linux`.
fn abi_os_call(l: &str) -> bool {
    let libc_call = l.match_indices("libc::").any(|(i, _)| {
        let before_ok = !l[..i].chars().next_back().is_some_and(is_ident);
        before_ok && !l[i + "libc::".len()..].starts_with("c_")
    });
    libc_call
        || has_token(l, "rustix::", false)
        || l.contains("std::fs")
        || l.contains("std::os")
        || has_token(l, "hetmem_linux", true)
}

fn check_abi_no_os_calls(files: &[Src]) -> Vec<String> {
    files.iter().flat_map(|f| f.hits(abi_os_call)).collect()
}

/// The CLI reaches hetmem through its public API: never `hetmem::backend` or the host folder;
/// of the platform crate only `hetmem_linux::copy`.
fn check_cli(files: &[Src]) -> Vec<String> {
    files
        .iter()
        .flat_map(|f| {
            f.hits(|l| {
                l.contains("hetmem::backend")
                    || l.contains("::host::")
                    || l.match_indices("hetmem_linux").any(|(i, _)| {
                        !l[i..].starts_with("hetmem_linux::copy::")
                            && !l[..i].chars().next_back().is_some_and(is_ident)
                    })
            })
        })
        .collect()
}

/// The rows of the module table of `semantics/mod.rs` (`//! | [`row`] | ... |`, or
/// `//! | `row` | ... |` for a private module), in order.
fn table_rows(mod_rs: &str) -> Vec<String> {
    mod_rs
        .lines()
        .filter_map(|l| {
            let t = l.trim_start().strip_prefix("//!")?.trim_start();
            let t = t.strip_prefix("| ")?;
            let t = t.strip_prefix('[').unwrap_or(t).strip_prefix('`')?;
            let end = t.find('`')?;
            Some(t[..end].to_string())
        })
        .collect()
}

/// The row of a semantics file path relative to `semantics/` (`ipc/format.rs` -> `ipc::format`,
/// `ipc/mod.rs` -> `ipc`, `vmm.rs` -> `vmm`); `None` for `mod.rs` itself.
fn row_of(rel: &str) -> Option<String> {
    let rel = rel.strip_suffix(".rs")?;
    if rel == "mod" {
        return None;
    }
    let rel = rel.strip_suffix("/mod").unwrap_or(rel);
    Some(rel.replace('/', "::"))
}

/// Every path in `l` that starts at `start` (e.g. `crate::`), as its segments after it, with
/// `use` trees expanded (`crate::semantics::{vmm::X, usm}` gives `semantics vmm X` and
/// `semantics usm`).
fn paths_from(l: &str, start: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in l.match_indices(start) {
        if l[..i]
            .chars()
            .next_back()
            .is_some_and(|c| is_ident(c) || c == ':')
        {
            continue;
        }
        expand_tree(&l[i + start.len()..], Vec::new(), &mut out);
    }
    out
}

/// Expands the use tree at the start of `s` with `prefix` into `out`.
fn expand_tree(s: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let s = s.trim_start();
    if let Some(rest) = s.strip_prefix('{') {
        // Split the group at top-level commas.
        let mut depth = 0;
        let mut start = 0;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = i;
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_tree(&rest[start..i], prefix.clone(), out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if start < end {
            expand_tree(&rest[start..end], prefix, out);
        }
        return;
    }
    let ident: String = s.chars().take_while(|&c| is_ident(c)).collect();
    if ident.is_empty() {
        // The end of a path, or a glob (`super::*` names the module itself).
        if !prefix.is_empty() || s.starts_with('*') {
            out.push(prefix);
        }
        return;
    }
    let mut p = prefix;
    p.push(ident.clone());
    let rest = &s[ident.len()..];
    match rest.strip_prefix("::") {
        Some(r) => expand_tree(r, p, out),
        None => out.push(p),
    }
}

/// The re-export paths of the crate root that lead into the semantics layer: a family module
/// (`crate::vmm`) or a name re-exported from one (`crate::PhysicalMemory` from `vmm`), each
/// with its family's row.
fn reexports(lib_rs: &str, rows: &[String]) -> Vec<(String, String)> {
    let families = ["acl", "ipc", "managed", "queue", "ranges", "usm", "vmm"];
    let mut out: Vec<(String, String)> = families
        .iter()
        .filter(|f| rows.iter().any(|r| r == *f))
        .map(|f| (f.to_string(), f.to_string()))
        .collect();
    let code = code_only(lib_rs);
    for stmt in code.split(';') {
        let Some(i) = stmt.find("pub use ") else {
            continue;
        };
        let mut paths = Vec::new();
        expand_tree(&stmt[i + "pub use ".len()..], Vec::new(), &mut paths);
        for p in paths {
            if p.len() >= 2 && families.contains(&p[0].as_str()) {
                out.push((p.last().unwrap().clone(), p[0].clone()));
            }
        }
    }
    out
}

/// The most specific row naming `segments` (`["ipc", "format", "X"]` -> `ipc::format` if it is
/// a row, else `ipc`); `None` if none.
fn resolve(rows: &[String], segments: &[String]) -> Option<String> {
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|c| rows.contains(c))
}

/// The rows file `row` imports (with the line of each), and the lines that import through a
/// re-export path of the crate root instead of `crate::semantics::...`.
fn imports_of(
    row: &str,
    is_folder_root: bool,
    src: &Src,
    rows: &[String],
    reexp: &[(String, String)],
) -> (Vec<(String, String)>, Vec<String>) {
    let mut deps = Vec::new();
    let mut via_reexport = Vec::new();
    // The modules `self` and `super` name, as row segments (`[]` is the semantics root): for
    // `vmm.rs` `[vmm]` and `[]`, for `ipc/mod.rs` `[ipc]` and `[]`, for `ipc/format.rs`
    // `[ipc, format]` and `[ipc]`.
    let self_path: Vec<String> = row.split("::").map(String::from).collect();
    let super_path = self_path[..self_path.len() - 1].to_vec();
    for (n, l) in &src.lines {
        let at = format!("{}:{}: {}", src.path, n, l.trim());
        let mut add = |r: Option<String>| {
            if let Some(r) = r {
                if r != row {
                    deps.push((r, at.clone()));
                }
            }
        };
        for p in paths_from(l, "crate::") {
            let Some(first) = p.first() else {
                continue;
            };
            if first == "semantics" {
                add(resolve(rows, &p[1..]));
            } else if let Some((_, fam)) = reexp.iter().find(|(name, _)| name == first) {
                via_reexport.push(at.clone());
                let mut segs = vec![fam.clone()];
                if first == fam {
                    segs.extend(p[1..].iter().cloned());
                }
                add(resolve(rows, &segs));
            }
        }
        for p in paths_from(l, "super::") {
            let mut base = super_path.clone();
            let mut rest = &p[..];
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            add(resolve(rows, &base));
        }
        for p in paths_from(l, "self::") {
            let mut base = self_path.clone();
            base.extend(p.iter().cloned());
            add(resolve(rows, &base));
        }
        if is_folder_root {
            // A folder's mod.rs names its children by bare paths (`pub use format::X`).
            for r in rows {
                if let Some(child) = r.strip_prefix(&format!("{row}::")) {
                    if !child.contains("::") && !paths_from(l, &format!("{child}::")).is_empty() {
                        add(Some(r.clone()));
                    }
                }
            }
        }
    }
    (deps, via_reexport)
}

/// A semantics file naming the API above it.
fn names_api(l: &str) -> bool {
    l.contains("crate::api")
        || [
            "crate::Context",
            "crate::Driver",
            "crate::Device",
            "crate::Runtime",
        ]
        .iter()
        .any(|p| has_token(l, p, true))
}

/// The order rule of the semantics layer over its files (`rel` relative to `semantics/`, the
/// table from `mod_rs`, the crate root's re-exports from `lib_rs`): every file is a row and
/// every row a file; each file imports only rows listed before it; none imports through a
/// re-export path of the crate root or names the API.
fn check_semantics_order(files: &[(String, Src)], mod_rs: &str, lib_rs: &str) -> Vec<String> {
    let rows = table_rows(mod_rs);
    let mut hits = Vec::new();
    if rows.len() < 8 {
        hits.push(format!(
            "semantics/mod.rs: its module table has {} rows ({rows:?}); expected one per file",
            rows.len()
        ));
        return hits;
    }
    let reexp = reexports(lib_rs, &rows);
    let mut seen = Vec::new();
    for (rel, src) in files {
        let Some(row) = row_of(rel) else {
            continue;
        };
        seen.push(row.clone());
        let Some(pos) = rows.iter().position(|r| *r == row) else {
            hits.push(format!(
                "{}: no row `{row}` in the module table of semantics/mod.rs",
                src.path
            ));
            continue;
        };
        let (deps, via) = imports_of(&row, rel.ends_with("/mod.rs"), src, &rows, &reexp);
        for (d, at) in deps {
            let dpos = rows.iter().position(|r| *r == d).expect("a row");
            if dpos >= pos {
                hits.push(format!(
                    "`{row}` imports `{d}`, listed after it in semantics/mod.rs: {at}"
                ));
            }
        }
        for at in via {
            hits.push(format!(
                "imports through a re-export path of the crate root (use crate::semantics::...): \
                 {at}"
            ));
        }
        hits.extend(
            src.hits(names_api)
                .into_iter()
                .map(|h| format!("names the API: {h}")),
        );
    }
    for r in &rows {
        if !seen.contains(r) {
            hits.push(format!(
                "semantics/mod.rs lists `{r}`, which is no file of src/semantics/"
            ));
        }
    }
    hits
}

/// The weaker rule the order implies: the semantics files import each other without a cycle
/// (whatever the table's order) and never name the API.
fn check_semantics_acyclic(files: &[(String, Src)], mod_rs: &str, lib_rs: &str) -> Vec<String> {
    let rows = table_rows(mod_rs);
    let reexp = reexports(lib_rs, &rows);
    let mut hits = Vec::new();
    let mut graph: Vec<(String, Vec<String>)> = Vec::new();
    for (rel, src) in files {
        let Some(row) = row_of(rel) else {
            continue;
        };
        let (deps, _) = imports_of(&row, rel.ends_with("/mod.rs"), src, &rows, &reexp);
        let mut d: Vec<String> = deps.into_iter().map(|(d, _)| d).collect();
        d.sort();
        d.dedup();
        graph.push((row, d));
        hits.extend(
            src.hits(names_api)
                .into_iter()
                .map(|h| format!("names the API: {h}")),
        );
    }
    // Kahn's algorithm: repeatedly remove modules that import nothing left.
    while let Some(i) = graph
        .iter()
        .position(|(_, deps)| deps.iter().all(|d| !graph.iter().any(|(m, _)| m == d)))
    {
        graph.remove(i);
    }
    if !graph.is_empty() {
        hits.push(format!("import cycle among {graph:?}"));
    }
    hits
}

// ------------------------------------------------------------------------------------------
// The rules, on the tree.

#[test]
fn only_the_platform_folders_make_os_calls_and_only_the_host_folder_names_the_host_backend() {
    let root = repo_root();
    let files = sources(&root, "crates/hetmem/src");
    assert!(files.len() > 20, "the source tree was not found");
    fail_on(
        "OS calls outside src/backend/{host,cuda}/, std::os or hetmem_linux above src/backend/, \
         or the host backend named outside its folder",
        check_hetmem_os_calls(&files),
    );
}

#[test]
fn std_os_and_the_platform_crate_are_named_only_in_the_backend_layer() {
    let files = sources(&repo_root(), "crates/hetmem/src");
    fail_on(
        "std::os or hetmem_linux above src/backend/",
        check_platform_names(&files),
    );
}

#[test]
fn the_semantics_modules_import_only_those_listed_before_them_and_never_the_api() {
    let root = repo_root();
    let src = root.join("crates/hetmem/src");
    let mod_rs = std::fs::read_to_string(src.join("semantics/mod.rs")).unwrap();
    let lib_rs = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    fail_on(
        "the semantics layer's import order (the table of semantics/mod.rs)",
        check_semantics_order(&semantics_files(&root), &mod_rs, &lib_rs),
    );
}

#[test]
fn the_api_builds_no_error_takes_no_lock_and_never_reaches_the_backend() {
    let files = sources(&repo_root(), "crates/hetmem/src/api");
    fail_on(
        "src/api/ is not thin (the semantics layer builds the errors, takes the locks and calls \
         the backend)",
        check_api_thin(&files),
    );
}

/// The platform crate is below hetmem: it never depends on it or names its backends.
#[test]
fn the_linux_platform_crate_is_below_hetmem() {
    let root = repo_root().join("crates/hetmem-linux");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        !manifest
            .lines()
            .any(|l| l.trim_start().starts_with("hetmem ")
                || l.trim_start().starts_with("hetmem=")
                || l.trim_start().starts_with("hetmem.")),
        "hetmem-linux depends on hetmem:\n{manifest}"
    );
    let files = sources(&repo_root(), "crates/hetmem-linux/src");
    let hits: Vec<String> = files
        .iter()
        .flat_map(|f| f.hits(|l| l.contains("hetmem::") || names_host_backend(l)))
        .collect();
    fail_on("hetmem-linux names hetmem", hits);
}

#[test]
fn the_cli_uses_only_the_public_api_and_never_the_backend_module() {
    let files = sources(&repo_root(), "crates/hetmem-cli/src");
    fail_on("the CLI reaches into the backend", check_cli(&files));
}

#[test]
fn the_c_abi_crates_make_no_os_call() {
    let root = repo_root();
    let mut files = sources(&root, "crates/hetmem-ze/src");
    files.extend(sources(&root, "crates/hetmem-acl/src"));
    fail_on(
        "OS calls in the C ABI crates (they translate onto hetmem's API)",
        check_abi_no_os_calls(&files),
    );
}

/// The semantics files of the tree, as `(path relative to semantics/, source)`.
fn semantics_files(root: &Path) -> Vec<(String, Src)> {
    sources(root, "crates/hetmem/src/semantics")
        .into_iter()
        .map(|s| {
            let rel = s
                .path
                .split("crates/hetmem/src/semantics/")
                .nth(1)
                .unwrap()
                .to_string();
            (rel, s)
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// Each checker flags a synthetic violation (and passes the same file without it).

fn one(path: &str, text: &str) -> Vec<Src> {
    vec![Src::new(path, text)]
}

#[test]
fn self_test_the_source_reader_drops_comments_strings_and_test_modules() {
    let s = Src::new(
        "x.rs",
        "let a = \"libc::mmap\"; // libc::mmap\n/* std::fs */ let b = r#\"std::os\"#;\n\
         let c = 'x'; fn f<'a>() {}\n#[cfg(test)]\nmod tests {\n    use libc::mmap;\n}\nlet d = 1;\n",
    );
    let text: Vec<&str> = s.lines.iter().map(|(_, l)| l.as_str()).collect();
    assert!(
        !text
            .iter()
            .any(|l| l.contains("libc") || l.contains("std::")),
        "{text:?}"
    );
    assert_eq!(s.lines.last().unwrap().0, 8, "{:?}", s.lines);
    assert!(text.iter().any(|l| l.contains("fn f<'a>")), "{text:?}");
}

#[test]
fn self_test_os_calls_and_platform_names_are_flagged_where_they_do_not_belong() {
    let bad = [
        (
            "crates/hetmem/src/semantics/vmm.rs",
            "unsafe { libc::mmap(p) };",
        ),
        ("crates/hetmem/src/backend/mod.rs", "rustix::mm::mmap(p);"),
        ("crates/hetmem/src/spec.rs", "let f = std::fs::read(p);"),
        (
            "crates/hetmem/src/backend/cuda/mod.rs",
            "use crate::backend::host::X;",
        ),
    ];
    for (p, t) in bad {
        assert_eq!(check_hetmem_os_calls(&one(p, t)).len(), 1, "{p}: {t}");
    }
    let fine = [
        (
            "crates/hetmem/src/backend/host/mod.rs",
            "rustix::mm::mmap(p);",
        ),
        ("crates/hetmem/src/backend/cuda/mod.rs", "libc::dlopen(p);"),
        (
            "crates/hetmem/src/backend/mod.rs",
            "host::HostBackend::new(c)",
        ),
        (
            "crates/hetmem/src/semantics/ipc.rs",
            "let libcount = 1; my_libc::x();",
        ),
    ];
    for (p, t) in fine {
        assert_eq!(
            check_hetmem_os_calls(&one(p, t)),
            Vec::<String>::new(),
            "{p}: {t}"
        );
    }
    let bad = [
        (
            "crates/hetmem/src/semantics/ipc.rs",
            "use std::os::fd::OwnedFd;",
        ),
        (
            "crates/hetmem/src/api/ipc.rs",
            "let x = hetmem_linux::dup(fd);",
        ),
        (
            "crates/hetmem/src/lib.rs",
            "pub use hetmem_linux::PlatformFacts;",
        ),
    ];
    for (p, t) in bad {
        assert_eq!(check_platform_names(&one(p, t)).len(), 1, "{p}: {t}");
    }
    let fine = [
        (
            "crates/hetmem/src/backend/platform.rs",
            "use std::os::fd::OwnedFd; hetmem_linux::dup(f);",
        ),
        (
            "crates/hetmem/src/backend/host/mod.rs",
            "use std::os::fd::OwnedFd;",
        ),
        (
            "crates/hetmem/src/semantics/ipc.rs",
            "let my_hetmem_linux_x = 1;",
        ),
    ];
    for (p, t) in fine {
        assert_eq!(
            check_platform_names(&one(p, t)),
            Vec::<String>::new(),
            "{p}: {t}"
        );
    }
}

#[test]
fn self_test_the_api_is_flagged_for_errors_locks_and_the_backend() {
    let p = "crates/hetmem/src/api/ipc.rs";
    for t in [
        "return Err(Error::InvalidArgument(format!(\"x\")));",
        ".map_err(|_| crate::Error::new(1))?;",
        "let vm = self.d().vm.read();",
        "let g = d.managed.state.lock();",
        "let usm = d.usm.write();",
        "d.backend.export_physical(p)?;",
        "core.res.prefetch(a, b);",
        "let r = f().map_err(residency_error)?;",
    ] {
        assert_eq!(check_api_thin(&one(p, t)).len(), 1, "{t}");
    }
    for t in [
        "crate::semantics::ipc::export_range(&self.shared, ptr, size)",
        "pub fn f(&self) -> Result<IpcHandle, Error> {",
        "let e: HalError = x; let backend_kind = self.backend_kind();",
        "let address = r.address; let res = 1;",
    ] {
        assert_eq!(check_api_thin(&one(p, t)), Vec::<String>::new(), "{t}");
    }
    // The builder's file is exempt.
    let builder = one(
        "crates/hetmem/src/api/runtime.rs",
        "Error::Uninitialized(m)",
    );
    assert!(check_api_thin(&builder).is_empty());
}

#[test]
fn self_test_the_c_abi_crates_are_flagged_for_os_calls() {
    for t in [
        "unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };",
        "let f = std::fs::OpenOptions::new();",
        "use std::os::unix::fs::OpenOptionsExt;",
        "rustix::time::clock_gettime(c);",
        "hetmem_linux::records::write(n, b)?;",
    ] {
        assert_eq!(
            check_abi_no_os_calls(&one("crates/hetmem-acl/src/vmm.rs", t)).len(),
            1,
            "{t}"
        );
    }
    let fine = one(
        "crates/hetmem-acl/src/vmm.rs",
        "pub extern \"C\" fn f(p: *mut libc::c_void, s: *const libc::c_char) -> i32 {",
    );
    assert!(check_abi_no_os_calls(&fine).is_empty());
}

#[test]
fn self_test_the_cli_is_flagged_for_reaching_below_the_public_api() {
    for t in [
        "use hetmem::backend::Backend;",
        "let n = hetmem_linux::open_fd_count();",
        "hetmem::backend::host::HostBackend::new(c);",
    ] {
        assert_eq!(
            check_cli(&one("crates/hetmem-cli/src/x.rs", t)).len(),
            1,
            "{t}"
        );
    }
    let fine = one(
        "crates/hetmem-cli/src/x.rs",
        "unsafe { hetmem_linux::copy::stream_copy(d, s, n) }; hetmem::platform::facts(); \
         use super::cuda::ok;",
    );
    assert!(check_cli(&fine).is_empty());
}

#[test]
fn the_semantics_modules_import_each_other_without_a_cycle_and_never_the_api() {
    let root = repo_root();
    let src = root.join("crates/hetmem/src");
    let mod_rs = std::fs::read_to_string(src.join("semantics/mod.rs")).unwrap();
    let lib_rs = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let files = semantics_files(&root);
    assert!(
        files.len() >= 8,
        "semantics modules not found: {}",
        files.len()
    );
    fail_on(
        "the semantics layer",
        check_semantics_acyclic(&files, &mod_rs, &lib_rs),
    );
}

/// A small semantics layer: `a`, the folder `f` (`f::x` then `f` itself), then `b`.
const TABLE: &str = "//! | module | what |\n//! |---|---|\n//! | [`a`] | a |\n\
    //! | `f::x` | x |\n//! | [`f`] | f |\n//! | [`b`] | b |\n\
    //! | [`c1`] | - |\n//! | [`c2`] | - |\n//! | [`c3`] | - |\n//! | [`c4`] | - |\n";
const LIB: &str = "pub use api::{ipc, vmm};\npub use vmm::{PhysicalMemory, Reservation};\n";

fn layer(extra: &[(&str, &str)]) -> Vec<(String, Src)> {
    let mut files: Vec<(String, String)> = [
        ("a.rs", "pub struct A;"),
        ("f/x.rs", "use crate::semantics::a::A;"),
        ("f/mod.rs", "mod x;\npub use x::*;\nuse super::a::A;"),
        ("b.rs", "use crate::semantics::{a::A, f::{x::X, Y}};"),
        ("c1.rs", ""),
        ("c2.rs", ""),
        ("c3.rs", ""),
        ("c4.rs", ""),
    ]
    .iter()
    .map(|(p, t)| (p.to_string(), t.to_string()))
    .collect();
    for (p, t) in extra {
        match files.iter_mut().find(|(q, _)| q == p) {
            Some(f) => f.1 = format!("{}\n{t}", f.1),
            None => files.push((p.to_string(), t.to_string())),
        }
    }
    files
        .into_iter()
        .map(|(p, t)| {
            let src = Src::new(&format!("crates/hetmem/src/semantics/{p}"), &t);
            (p, src)
        })
        .collect()
}

#[test]
fn self_test_the_semantics_order_is_flagged_when_broken_through_any_path() {
    assert_eq!(
        check_semantics_order(&layer(&[]), TABLE, LIB),
        Vec::<String>::new()
    );
    let ipc_table = TABLE
        .replace("[`c1`]", "[`ipc`]")
        .replace("[`c2`]", "[`vmm`]");
    // `layer` with c1.rs and c2.rs named ipc.rs and vmm.rs.
    let with_families = |extra: &[(&str, &str)]| {
        let extra: Vec<(&str, &str)> = extra
            .iter()
            .map(|&(p, t)| match p {
                "ipc.rs" => ("c1.rs", t),
                "vmm.rs" => ("c2.rs", t),
                _ => (p, t),
            })
            .collect();
        let mut l = layer(&extra);
        for (p, _) in l.iter_mut() {
            match p.as_str() {
                "c1.rs" => *p = "ipc.rs".into(),
                "c2.rs" => *p = "vmm.rs".into(),
                _ => {}
            }
        }
        l
    };
    assert_eq!(
        check_semantics_order(&with_families(&[]), &ipc_table, LIB),
        Vec::<String>::new()
    );
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "a crate::semantics path",
            vec![("a.rs", "use crate::semantics::b::B;")],
        ),
        (
            "a grouped use",
            vec![("a.rs", "use crate::semantics::{f::x::X, b};")],
        ),
        (
            "an inline path",
            vec![("f/x.rs", "let y = crate::semantics::f::Y;")],
        ),
        (
            "a super path from a folder's file",
            vec![("f/x.rs", "use super::Y;")],
        ),
        (
            "a super::super path",
            vec![("f/x.rs", "use super::super::b::B;")],
        ),
        (
            "a super path from a top file",
            vec![("a.rs", "use super::b::B;")],
        ),
        (
            "a self path of a folder",
            vec![("f/mod.rs", "use self::z::Z;"), ("f/z.rs", "")],
        ),
        ("a file not in the table", vec![("d.rs", "")]),
    ];
    for (what, extra) in cases {
        let t = TABLE.replace("[`c4`] | - |", "[`c4`] | - |\n//! | [`f::z`] | - |");
        let mut files = layer(&extra);
        if !extra.iter().any(|(p, _)| *p == "f/z.rs") {
            files.push((
                "f/z.rs".into(),
                Src::new("crates/hetmem/src/semantics/f/z.rs", ""),
            ));
        }
        let hits = check_semantics_order(&files, &t, LIB);
        assert!(!hits.is_empty(), "{what} not flagged");
    }
    // A folder's mod.rs names its children by bare paths: listed before its child, it breaks
    // the order.
    let parent_first = TABLE.replace(
        "//! | `f::x` | x |\n//! | [`f`] | f |",
        "//! | [`f`] | f |\n//! | [`f::x`] | x |",
    );
    assert_ne!(parent_first, TABLE);
    let hits = check_semantics_order(&layer(&[]), &parent_first, LIB);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].contains("pub use x::*"), "{hits:?}");
    // A row with no file.
    let t = TABLE.replace("[`c4`] | - |", "[`c4`] | - |\n//! | [`gone`] | - |");
    assert_eq!(check_semantics_order(&layer(&[]), &t, LIB).len(), 1);
    // Through the crate root's re-export paths: flagged for the path, and for the order.
    for t in [
        "use crate::vmm::Reservation;",
        "let m: crate::PhysicalMemory = x;",
    ] {
        let hits = check_semantics_order(&with_families(&[("ipc.rs", t)]), &ipc_table, LIB);
        assert_eq!(hits.len(), 2, "{t}: {hits:?}");
        let hits = check_semantics_order(&with_families(&[("vmm.rs", t)]), &ipc_table, LIB);
        assert_eq!(hits.len(), 1, "{t}: {hits:?}");
        assert!(hits[0].contains("re-export"), "{hits:?}");
    }
    // A cycle, whatever the order.
    let cyc = layer(&[("a.rs", "use crate::semantics::b::B;")]);
    let hits = check_semantics_acyclic(&cyc, TABLE, LIB);
    assert!(hits.len() == 1 && hits[0].contains("cycle"), "{hits:?}");
    assert!(check_semantics_acyclic(&layer(&[]), TABLE, LIB).is_empty());
    // Naming the API.
    let hits = check_semantics_order(
        &layer(&[("b.rs", "fn f(c: &crate::Context) {}")]),
        TABLE,
        LIB,
    );
    assert_eq!(hits.len(), 1, "{hits:?}");
}
