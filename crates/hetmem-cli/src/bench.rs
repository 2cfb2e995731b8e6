//! `hetmem bench`: placeholder, being written.

/// Arguments of `hetmem bench`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), String> {
    Err("bench not written yet".into())
}
