//! Replays one saved input through a target: `replay TARGET FILE`.
fn main() {
    let mut args = std::env::args().skip(1);
    let (name, file) = (args.next().expect("target"), args.next().expect("file"));
    let f = pmo_fuzz_targets::TARGETS
        .iter()
        .find(|t| t.0 == name)
        .expect("known target")
        .1;
    f(&std::fs::read(file).expect("input file"));
    println!("{name}: ok");
}
