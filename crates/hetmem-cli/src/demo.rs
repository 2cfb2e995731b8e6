//! `hetmem demo`: placeholder, being written.

/// Arguments of `hetmem demo`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), String> {
    Err("demo not written yet".into())
}
