// Binds the library's references to its own `ze*` symbols locally (-Bsymbolic): the DDI tables
// and the exported functions must point into this library even when the process has already
// loaded another definition of the same names (the loader's own `zeInit`, `zeMemAllocHost`, …).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rerun-if-changed=build.rs");
}
