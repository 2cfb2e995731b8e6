//! Checks of the command line's values that clap's own parsers do not make: counts that must be
//! positive (with the option's range in the message), seconds, and output files checked before
//! a long run starts rather than when it ends.
//!
//! A value parser's error reaches the user as clap prints it, naming the option and the value:
//! `error: invalid value '-3' for '--requests <REQUESTS>': must be a positive count, a whole
//! number from 1 to 10,000,000`. Options that use these parsers also accept values that look
//! negative (`allow_negative_numbers`), so `-3` is reported as a bad count rather than as an
//! unknown option.

use std::path::{Path, PathBuf};

/// `1234567` as `1,234,567`.
pub fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        let left = s.len() - i;
        if i > 0 && left / 3 * 3 == left {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A value parser for a count of at least `min` and at most `max`, of type `T` (u32, u64,
/// usize). With `min` 1 the message says it must be a positive count.
pub fn count<T>(min: u64, max: u64) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync
where
    T: TryFrom<u64>,
{
    move |s: &str| {
        let what = if min == 1 {
            "a positive count".to_string()
        } else if min == 0 {
            "a count".to_string()
        } else {
            format!("a count of at least {}", thousands(min))
        };
        let range = format!(
            "a whole number from {} to {}",
            thousands(min),
            thousands(max)
        );
        let v: u64 = match s.trim().parse::<u64>() {
            Ok(v) => v,
            // A negative or fractional number, or not a number at all.
            Err(_) => return Err(format!("must be {what}, {range}")),
        };
        if v < min || v > max {
            return Err(format!("must be {what}, {range}"));
        }
        T::try_from(v).map_err(|_| format!("must be {what}, {range}"))
    }
}

/// A value parser for a number of seconds, 0 or more and at most `max`.
pub fn seconds(max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync {
    move |s: &str| match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=max).contains(&v) => Ok(v),
        _ => Err(format!(
            "must be a number of seconds from 0 to {}",
            thousands(max as u64)
        )),
    }
}

/// Checks, before any work, that `path` (the value of `option`, e.g. `--json`) can be written
/// at the end: not a folder, in a folder that exists, and writable. Nothing is created.
pub fn check_output(option: &str, path: &Path) -> Result<(), String> {
    let fail = |why: String| {
        Err(format!(
            "{option} {}: {why} (checked before the run, so nothing was run)",
            path.display()
        ))
    };
    if path.as_os_str().is_empty() {
        return fail("the path is empty".into());
    }
    if path.is_dir() {
        return fail("that is a folder; name a file in it".into());
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match std::fs::metadata(&parent) {
        Err(_) => return fail(format!("the folder {} does not exist", parent.display())),
        Ok(m) if !m.is_dir() => return fail(format!("{} is not a folder", parent.display())),
        Ok(_) => {}
    }
    let writable = |p: &Path| rustix::fs::access(p, rustix::fs::Access::WRITE_OK).is_ok();
    if path.exists() {
        if !writable(path) {
            return fail("the file exists and cannot be written".into());
        }
    } else if !writable(&parent) {
        return fail(format!("the folder {} cannot be written", parent.display()));
    }
    Ok(())
}

/// [`check_output`] for each `(option, path)` given, and that no two name the same file.
pub fn check_outputs(outputs: &[(&str, Option<&Path>)]) -> Result<(), String> {
    let given: Vec<(&str, &Path)> = outputs
        .iter()
        .filter_map(|(o, p)| p.map(|p| (*o, p)))
        .collect();
    for (o, p) in &given {
        check_output(o, p)?;
    }
    for (i, (o1, p1)) in given.iter().enumerate() {
        for (o2, p2) in &given[i + 1..] {
            if p1 == p2 {
                return Err(format!(
                    "{o1} and {o2} both name {}; the second would overwrite the first",
                    p1.display()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_refuses_zero_negative_fraction_text_and_too_large_naming_the_range() {
        let p = count::<u32>(1, 1024);
        assert_eq!(p("7"), Ok(7));
        assert_eq!(p("1024"), Ok(1024));
        for bad in ["0", "-3", "1.5", "abc", "", "1025"] {
            let e = p(bad).unwrap_err();
            assert_eq!(
                e, "must be a positive count, a whole number from 1 to 1,024",
                "{bad:?}"
            );
        }
        let e = count::<u32>(2, 10)("1").unwrap_err();
        assert_eq!(
            e,
            "must be a count of at least 2, a whole number from 2 to 10"
        );
        assert_eq!(count::<u64>(0, 5)("0"), Ok(0));
    }

    #[test]
    fn seconds_refuses_negative_and_non_numbers() {
        let p = seconds(1e6);
        assert_eq!(p("0"), Ok(0.0));
        assert_eq!(p("2.5"), Ok(2.5));
        for bad in ["-1", "NaN", "inf", "x", "1000001"] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn output_in_a_missing_folder_or_a_folder_itself_is_refused_naming_it() {
        let e = check_output("--json", Path::new("/nonexistent-hetmem/out.json")).unwrap_err();
        assert!(
            e.starts_with("--json /nonexistent-hetmem/out.json: the folder /nonexistent-hetmem does not exist"),
            "{e}"
        );
        let e = check_output("--plot", Path::new("/tmp")).unwrap_err();
        assert!(e.contains("that is a folder"), "{e}");
        assert!(check_output("--plot", Path::new("plot.svg")).is_ok());
        let e = check_outputs(&[
            ("--plot", Some(Path::new("a.out"))),
            ("--json", Some(Path::new("a.out"))),
        ])
        .unwrap_err();
        assert!(e.contains("--plot and --json both name a.out"), "{e}");
    }
}
