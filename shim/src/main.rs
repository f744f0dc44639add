//! berth-shim: the per-container supervisor. Its body lands with the runtime issue.

fn main() {
    eprintln!("berth-shim: not implemented yet (the runtime issue builds it)");
    std::process::exit(2);
}
