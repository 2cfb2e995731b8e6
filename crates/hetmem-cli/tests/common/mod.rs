//! Shared by the `hetmem` command's tests (`mod common;` in each file).
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs the built `hetmem` with `args`, every inherited `HETMEM_` variable removed and `env`
/// set; returns how it ended with its stdout and stderr as text.
pub fn hetmem(args: &[&str], env: &[(&str, &str)]) -> (Output, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hetmem"));
    c.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("HETMEM_") {
            c.env_remove(k);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run hetmem");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (o, out, err)
}
