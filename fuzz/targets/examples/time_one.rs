fn main() {
    let name = std::env::args().nth(1).unwrap();
    let n: usize = std::env::args().nth(2).map_or(100, |s| s.parse().unwrap());
    let f = pmo_fuzz_targets::TARGETS
        .iter()
        .find(|t| t.0 == name)
        .unwrap()
        .1;
    let mut rng = pmo_fuzz_targets::common::Rng::new(1);
    let t = std::time::Instant::now();
    for _ in 0..n {
        f(&rng.input(512));
    }
    println!("{name}: {n} runs in {:?}", t.elapsed());
}
