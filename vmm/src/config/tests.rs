use super::*;
use clap::Parser;
use std::fs::File;
use std::path::PathBuf;

const GIB: u64 = 1 << 30;

/// `pmovmm run` as the binary will define it.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
}

fn args(argv: &[&str]) -> RunArgs {
    Cli::try_parse_from(std::iter::once("run").chain(argv.iter().copied()))
        .expect("flags parse")
        .run
}

/// A scratch directory with a kernel and an initrd, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("pmovmm-config-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("bzImage"), b"kernel").unwrap();
        std::fs::write(dir.join("initrd.gz"), b"initrd").unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    fn file(&self, name: &str, len: u64) -> String {
        let f = File::create(self.path(name)).unwrap();
        f.set_len(len).unwrap();
        self.arg(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn err(argv: &[&str]) -> String {
    VmConfig::from_args(&args(argv))
        .expect_err("config must be rejected")
        .to_string()
}

#[test]
fn option_lists() {
    let keys = &["media", "size", "lsa", "ways"];
    let o = OptionList::parse("cxl-t3", "m.img,1G,lsa=l.img,ways=2", keys, 2).unwrap();
    assert_eq!(o.get("media"), Some("m.img"));
    assert_eq!(o.size("size").unwrap(), Some(GIB));
    assert_eq!(o.get("lsa"), Some("l.img"));
    assert_eq!(o.get("ways"), Some("2"));
    assert_eq!(o.size("lsa").unwrap_err().to_string(),
            "invalid cxl-t3 \"m.img,1G,lsa=l.img,ways=2\": invalid size \"l.img\" (bytes, or a number with K, M, G or T)");

    let o = OptionList::parse("cxl-t3", "size=2M,media=x", keys, 0).unwrap();
    assert_eq!(o.required("media").unwrap(), "x");
    assert_eq!(o.get("lsa"), None);
    assert_eq!(o.size("size").unwrap(), Some(2 * MIB));
    assert_eq!(o.size("lsa").unwrap(), None);
    assert_eq!(
        o.required("lsa").unwrap_err().to_string(),
        "invalid cxl-t3 \"size=2M,media=x\": missing lsa"
    );

    for (text, positional, reason) in [
        ("", 2, "empty item"),
        ("a,,b", 2, "empty item"),
        ("a,", 2, "empty item"),
        ("a,b,c", 2, "unexpected value \"c\""),
        ("a", 0, "unexpected value \"a\""),
        ("media=a,b", 2, "\"b\" must be written as key=value"),
        (
            "a,colour=red",
            2,
            "unknown key \"colour\" (expected media, size, lsa, ways)",
        ),
        ("a,media=b", 2, "media given twice"),
        ("a,size=", 2, "empty value for size"),
        (
            "=x",
            2,
            "unknown key \"\" (expected media, size, lsa, ways)",
        ),
    ] {
        let e = OptionList::parse("cxl-t3", text, keys, positional).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("invalid cxl-t3 \"{text}\": {reason}")
        );
    }
    let o = OptionList::parse("x", "ways=lots", keys, 0).unwrap();
    assert_eq!(
        o.error("ways must be a number".into()).to_string(),
        "invalid x \"ways=lots\": ways must be a number"
    );
}

#[test]
fn full_command_line() {
    let s = Scratch::new("cli");
    let pmem1 = s.file("existing.img", 4 * MIB);
    let argv = [
        "--kernel",
        &s.arg("bzImage"),
        "--initrd",
        &s.arg("initrd.gz"),
        "--cmdline",
        "console=ttyS0 quiet",
        "--memory",
        "1G",
        "--cpus",
        "2",
        "--pmem",
        &format!("{},64M", s.arg("new.img")),
        "--pmem",
        &pmem1,
        "--pmem",
        &format!("path={},size=4M", s.arg("empty.img")),
        "--console",
        &s.arg("console.log"),
    ];
    s.file("empty.img", 0);
    let cfg = VmConfig::from_args(&args(&argv)).unwrap();
    assert_eq!(
        cfg,
        VmConfig {
            kernel: s.path("bzImage"),
            initrd: Some(s.path("initrd.gz")),
            cmdline: "console=ttyS0 quiet".into(),
            memory: GIB,
            cpus: 2,
            pmem: vec![
                PmemConfig {
                    path: s.path("new.img"),
                    size: 64 * MIB
                },
                PmemConfig {
                    path: s.path("existing.img"),
                    size: 4 * MIB
                },
                PmemConfig {
                    path: s.path("empty.img"),
                    size: 4 * MIB
                },
            ],
            console: ConsoleOutput::File(s.path("console.log")),
            pmo: None,
            cxl_t3: vec![],
            pmo_on_cxl: None,
            sandbox: Policy {
                seccomp: SeccompMode::On,
                landlock: LandlockMode::On,
            },
        }
    );
    // Validation created nothing.
    assert!(!s.path("new.img").exists());
    assert!(!s.path("console.log").exists());
}

#[test]
fn defaults() {
    let s = Scratch::new("defaults");
    let cfg = VmConfig::from_args(&args(&["--kernel", &s.arg("bzImage")])).unwrap();
    assert_eq!(cfg.initrd, None);
    assert_eq!(cfg.cmdline, DEFAULT_CMDLINE);
    assert_eq!(cfg.memory, DEFAULT_MEMORY);
    assert_eq!(cfg.cpus, DEFAULT_CPUS);
    assert!(cfg.pmem.is_empty());
    assert_eq!(cfg.console, ConsoleOutput::Stdout);
    let cfg = VmConfig::from_args(&args(&[
        "--kernel",
        &s.arg("bzImage"),
        "--console",
        "stdout",
    ]))
    .unwrap();
    assert_eq!(cfg.console, ConsoleOutput::Stdout);
}

#[test]
fn the_sandbox_is_on_unless_turned_off() {
    let s = Scratch::new("sandbox");
    let k = s.arg("bzImage");
    let policy = |extra: &[&str]| {
        let mut argv = vec!["--kernel", k.as_str()];
        argv.extend_from_slice(extra);
        VmConfig::from_args(&args(&argv)).map(|c| c.sandbox)
    };
    assert_eq!(
        policy(&[]).unwrap(),
        Policy {
            seccomp: SeccompMode::On,
            landlock: LandlockMode::On
        }
    );
    assert_eq!(
        policy(&["--seccomp", "log", "--landlock", "require"]).unwrap(),
        Policy {
            seccomp: SeccompMode::Log,
            landlock: LandlockMode::Require
        }
    );
    assert_eq!(
        policy(&["--seccomp", "off", "--landlock", "off"]).unwrap(),
        Policy {
            seccomp: SeccompMode::Off,
            landlock: LandlockMode::Off
        }
    );
    assert_eq!(
        policy(&["--seccomp", "kill"]).unwrap_err().to_string(),
        "seccomp \"kill\": expected on, log or off"
    );
    assert_eq!(
        policy(&["--landlock", "yes"]).unwrap_err().to_string(),
        "landlock \"yes\": expected on, require or off"
    );
    // The file has the same fields; a flag wins over it.
    std::fs::write(
        s.path("vm.toml"),
        "kernel = \"bzImage\"\nseccomp = \"log\"\nlandlock = \"off\"\n",
    )
    .unwrap();
    let from_file = VmConfig::from_args(&args(&["--config", &s.arg("vm.toml")])).unwrap();
    assert_eq!(from_file.sandbox.seccomp, SeccompMode::Log);
    assert_eq!(from_file.sandbox.landlock, LandlockMode::Off);
    let cfg =
        VmConfig::from_args(&args(&["--config", &s.arg("vm.toml"), "--seccomp", "on"])).unwrap();
    assert_eq!(cfg.sandbox.seccomp, SeccompMode::On);
    assert_eq!(
        cfg.sandbox.landlock,
        LandlockMode::Off,
        "kept from the file"
    );
}

#[test]
fn memory_limits() {
    let s = Scratch::new("memory");
    let k = s.arg("bzImage");
    let ok =
        |m: &str| VmConfig::from_args(&args(&["--kernel", &k, "--memory", m])).map(|c| c.memory);
    assert_eq!(ok("64M").unwrap(), 64 * MIB);
    assert_eq!(ok("67108864").unwrap(), 64 * MIB);
    assert_eq!(ok("6G").unwrap(), 6 * GIB, "RAM above 4 GiB");
    assert_eq!(ok("127G").unwrap(), MAX_MEMORY);
    let e = |m: &str| err(&["--kernel", &k, "--memory", m]);
    assert_eq!(e("65M"), "memory 65M: must be a multiple of 2M");
    assert_eq!(e("1025K"), "memory 1025K: must be at least 64M");
    assert_eq!(e("62M"), "memory 62M: must be at least 64M");
    assert_eq!(
        e("128G"),
        "memory 128G: must be at most 127G (the guest address map)"
    );
    assert_eq!(
        e("1T"),
        "memory 1T: must be at most 127G (the guest address map)"
    );
    assert_eq!(
        e("1P"),
        "invalid size \"1P\" (bytes, or a number with K, M, G or T)"
    );
    // The layout really has room for MAX_MEMORY of RAM.
    let end = layout::ram_regions(MAX_MEMORY)
        .last()
        .map(|r| r.0 + r.1)
        .unwrap();
    assert_eq!(end, layout::DEVICE_MEM_START);
}

#[test]
fn cpu_limits() {
    let s = Scratch::new("cpus");
    let k = s.arg("bzImage");
    for (n, want) in [("1", 1u8), ("64", 64)] {
        let cfg = VmConfig::from_args(&args(&["--kernel", &k, "--cpus", n])).unwrap();
        assert_eq!(cfg.cpus, want);
    }
    for n in ["0", "65", "256", "-1", "two", ""] {
        assert_eq!(
            err(&["--kernel", &k, &format!("--cpus={n}")]),
            format!("cpus \"{n}\": expected a number from 1 to 64")
        );
    }
}

#[test]
fn kernel_and_initrd_must_be_readable_files() {
    let s = Scratch::new("files");
    assert_eq!(
        err(&[]),
        "no kernel given: use --kernel FILE or `kernel` in the config file"
    );
    assert_eq!(
        err(&["--kernel", "/x/bzImage"]),
        "kernel file /x/bzImage: No such file or directory"
    );
    assert_eq!(
        err(&["--kernel", &s.arg("")]),
        format!("kernel file {}: not a regular file", s.arg(""))
    );
    assert_eq!(
        err(&["--kernel", &s.arg("bzImage"), "--initrd", "/x/initrd"]),
        "initrd file /x/initrd: No such file or directory"
    );
}

#[test]
fn cmdline_limits() {
    let s = Scratch::new("cmdline");
    let k = s.arg("bzImage");
    let longest = "x".repeat(layout::CMDLINE_MAX_SIZE - 1);
    let cfg = VmConfig::from_args(&args(&["--kernel", &k, "--cmdline", &longest])).unwrap();
    assert_eq!(cfg.cmdline, longest);
    let too_long = "x".repeat(layout::CMDLINE_MAX_SIZE);
    assert_eq!(
        err(&["--kernel", &k, "--cmdline", &too_long]),
        "kernel command line is 2048 bytes: must be shorter than 2048"
    );
    let mut a = args(&["--kernel", &k]);
    a.cmdline = Some("a\0b".into());
    assert_eq!(
        VmConfig::from_args(&a).unwrap_err().to_string(),
        "kernel command line contains a NUL byte"
    );
    // A command line that starts with a dash is a value, not a flag.
    let cfg = VmConfig::from_args(&args(&["--kernel", &k, "--cmdline", "-b"])).unwrap();
    assert_eq!(cfg.cmdline, "-b");
}

#[test]
fn pmem_errors() {
    let s = Scratch::new("pmem");
    let k = s.arg("bzImage");
    let odd = s.file("odd.img", 3 * MIB);
    let four = s.file("four.img", 4 * MIB);
    s.file("empty.img", 0);
    let e = |p: &str| err(&["--kernel", &k, "--pmem", p]);
    let new = s.arg("new.img");
    assert_eq!(
        e(&format!("{new},3M")),
        format!("pmem {new}: size 3M is not a multiple of 2M")
    );
    assert_eq!(
        e(&format!("{new},0")),
        format!("pmem {new}: size must not be zero")
    );
    assert_eq!(
        e(&format!("{new},1Q")),
        format!(
            "invalid pmem \"{new},1Q\": invalid size \"1Q\" (bytes, or a number with K, M, G or T)"
        )
    );
    assert_eq!(
        e(&format!("{new},2M,x")),
        format!("invalid pmem \"{new},2M,x\": unexpected value \"x\"")
    );
    assert_eq!(
        e(&new),
        format!("pmem {new}: the file does not exist or is empty, give its size as FILE,SIZE")
    );
    assert_eq!(
        e(&s.arg("empty.img")),
        format!(
            "pmem {}: the file does not exist or is empty, give its size as FILE,SIZE",
            s.arg("empty.img")
        )
    );
    assert_eq!(
        e(&odd),
        format!("pmem {odd}: size 3M is not a multiple of 2M")
    );
    assert_eq!(
        e(&format!("{four},8M")),
        format!("pmem {four}: the file holds 4M but 8M was given")
    );
    assert_eq!(
        e("/no/such/dir/p.img,2M"),
        "pmem file /no/such/dir/p.img: directory /no/such/dir does not exist"
    );
    assert_eq!(
        e(&s.arg("")),
        format!("pmem file {}: not a regular file", s.arg(""))
    );
    assert_eq!(
        err(&[
            "--kernel",
            &k,
            "--pmem",
            &four,
            "--pmem",
            &format!("path={four}")
        ]),
        format!("pmem {four}: given twice")
    );
    let big = |n: &str| format!("{},100G", s.arg(n));
    assert_eq!(
        err(&[
            "--kernel",
            &k,
            "--pmem",
            &big("a.img"),
            "--pmem",
            &big("b.img")
        ]),
        "pmem devices total 200G: more than the 128G of device memory"
    );
    assert!(!s.path("a.img").exists());
}

#[test]
fn console_output() {
    let s = Scratch::new("console");
    let k = s.arg("bzImage");
    assert_eq!(
        err(&["--kernel", &k, "--console", ""]),
        "console \"\": expected a file name or stdout"
    );
    assert_eq!(
        err(&["--kernel", &k, "--console", "/no/such/dir/log"]),
        "console file /no/such/dir/log: directory /no/such/dir does not exist"
    );
    let cfg = VmConfig::from_args(&args(&["--kernel", &k, "--console", "log"])).unwrap();
    assert_eq!(
        cfg.console,
        ConsoleOutput::File("log".into()),
        "relative to the cwd"
    );
}

#[test]
fn toml_file_is_equivalent_to_the_flags() {
    let s = Scratch::new("toml");
    s.file("p.img", 4 * MIB);
    let toml = r#"
            kernel = "bzImage"
            initrd = "initrd.gz"
            cmdline = "console=ttyS0 quiet"
            memory = "1G"
            cpus = 2
            pmem = ["p.img", "q.img,2M"]
            console = "console.log"
        "#;
    std::fs::write(s.path("vm.toml"), toml).unwrap();
    let from_file = VmConfig::from_args(&args(&["--config", &s.arg("vm.toml")])).unwrap();
    let from_flags = VmConfig::from_args(&args(&[
        "--kernel",
        &s.arg("bzImage"),
        "--initrd",
        &s.arg("initrd.gz"),
        "--cmdline",
        "console=ttyS0 quiet",
        "--memory",
        "1G",
        "--cpus",
        "2",
        "--pmem",
        &s.arg("p.img"),
        "--pmem",
        &format!("{},2M", s.arg("q.img")),
        "--console",
        &s.arg("console.log"),
    ]))
    .unwrap();
    assert_eq!(from_file, from_flags);

    // Integers are bytes, like on the command line; cpus may be a string.
    std::fs::write(
        s.path("int.toml"),
        "kernel = \"bzImage\"\nmemory = 134217728\ncpus = \"3\"\n",
    )
    .unwrap();
    let cfg = VmConfig::from_args(&args(&["--config", &s.arg("int.toml")])).unwrap();
    assert_eq!((cfg.memory, cfg.cpus), (128 * MIB, 3));
}

#[test]
fn flags_override_the_file() {
    let s = Scratch::new("override");
    s.file("a.img", 2 * MIB);
    s.file("b.img", 4 * MIB);
    std::fs::write(s.path("other-kernel"), b"k2").unwrap();
    let toml = "kernel = \"bzImage\"\nmemory = \"1G\"\ncpus = 4\ncmdline = \"from file\"\n\
                    pmem = [\"a.img\"]\nconsole = \"file.log\"\n";
    std::fs::write(s.path("vm.toml"), toml).unwrap();
    let cfg = VmConfig::from_args(&args(&[
        "--config",
        &s.arg("vm.toml"),
        "--kernel",
        &s.arg("other-kernel"),
        "--cpus",
        "1",
        "--pmem",
        &s.arg("b.img"),
        "--console",
        "stdout",
    ]))
    .unwrap();
    assert_eq!(cfg.kernel, s.path("other-kernel"));
    assert_eq!(cfg.cpus, 1);
    assert_eq!(cfg.memory, GIB, "kept from the file");
    assert_eq!(cfg.cmdline, "from file", "kept from the file");
    assert_eq!(
        cfg.pmem,
        vec![PmemConfig {
            path: s.path("b.img"),
            size: 4 * MIB
        }],
        "replaced, not appended"
    );
    assert_eq!(cfg.console, ConsoleOutput::Stdout);
}

#[test]
fn toml_errors() {
    let s = Scratch::new("toml-errors");
    let run = |name: &str, text: &str| {
        std::fs::write(s.path(name), text).unwrap();
        err(&["--config", &s.arg(name)])
    };
    let p = |name: &str| s.arg(name);
    assert_eq!(
        err(&["--config", "/no/vm.toml"]),
        "config file /no/vm.toml: No such file or directory"
    );
    let e = run("typo.toml", "kernel = \"bzImage\"\nmemroy = \"1G\"\n");
    assert!(
        e.starts_with(&format!(
            "config file {}: line 2: unknown field `memroy`",
            p("typo.toml")
        )),
        "{e}"
    );
    let e = run("syntax.toml", "kernel = \"bzImage\"\n\ncpus = = 2\n");
    assert!(
        e.starts_with(&format!("config file {}: line 3: ", p("syntax.toml"))),
        "{e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    let e = run("type.toml", "kernel = 5\n");
    assert!(
        e.starts_with(&format!("config file {}: line 1: ", p("type.toml"))),
        "{e}"
    );
    assert_eq!(
        run("float.toml", "kernel = \"bzImage\"\nmemory = 1.5\n"),
        format!(
            "config file {}: line 2: invalid type: floating point `1.5`, expected a string or an integer",
            p("float.toml")
        )
    );
    assert_eq!(
        run("neg.toml", "kernel = \"bzImage\"\nmemory = -1\n"),
        "invalid size \"-1\" (bytes, or a number with K, M, G or T)"
    );
    assert_eq!(
        run("cpus.toml", "kernel = \"bzImage\"\ncpus = 100\n"),
        "cpus \"100\": expected a number from 1 to 64"
    );
    assert_eq!(
            run("pmem.toml", "kernel = \"bzImage\"\npmem = [\"x.img,huge\"]\n"),
            format!("invalid pmem \"x.img,huge\": invalid size \"huge\" (bytes, or a number with K, M, G or T)")
        );
    assert_eq!(
        run("nokernel.toml", "memory = \"1G\"\n"),
        "no kernel given: use --kernel FILE or `kernel` in the config file"
    );
    assert_eq!(
        run("missing.toml", "kernel = \"nope\"\n"),
        format!("kernel file {}: No such file or directory", p("nope"))
    );
}

#[test]
fn pmo_store_settings() {
    let s = Scratch::new("pmo");
    let kernel = s.arg("bzImage");
    let store = s.arg("store.img");
    let base = ["--kernel", kernel.as_str()];
    let with = |extra: &[&str]| {
        let mut v: Vec<&str> = base.to_vec();
        v.extend_from_slice(extra);
        VmConfig::from_args(&args(&v))
    };
    let cfg = with(&["--pmo-store", &format!("{store},1G"), "--pmo-design", "d"]).unwrap();
    assert_eq!(
        cfg.pmo,
        Some(PmoConfig {
            store: s.path("store.img"),
            store_size: Some(GIB),
            design: Some(Design::D),
            window_size: DEFAULT_PMO_WINDOW,
            fault_threads: PMO_FAULT_THREADS,
            test_kill_in_psync: None,
            predictor: PredictorSpec::None,
            store_options: StoreOptions::default(),
            dram_budget: None,
            device_memory_latency_ns: 0,
        })
    );
    assert_eq!(with(&[]).unwrap().pmo, None);
    assert_eq!(
        with(&["--pmo-store", &store]).unwrap_err().to_string(),
        format!("PMO store {store}: does not exist; give its size to create it (FILE,SIZE)")
    );
    assert!(matches!(
        with(&["--pmo-design", "d"]).unwrap_err(),
        ConfigError::PmoWithoutStore
    ));
    assert!(matches!(
        with(&["--pmo-store", &format!("{store},1G"), "--pmo-window", "3M"]).unwrap_err(),
        ConfigError::PmoWindow(_)
    ));
    assert!(matches!(
        with(&[
            "--pmo-store",
            &format!("{store},1G"),
            "--pmo-window",
            "128G"
        ])
        .unwrap_err(),
        ConfigError::PmoWindow(_)
    ));
    let w = with(&["--pmo-store", &format!("{store},1G"), "--pmo-window", "64M"]).unwrap();
    assert_eq!(w.pmo.unwrap().window_size, 64 * MIB);
    assert!(matches!(
        with(&["--pmo-predictor", "stream:4"]).unwrap_err(),
        ConfigError::PmoWithoutStore
    ));
    let p = with(&[
        "--pmo-store",
        &format!("{store},1G"),
        "--pmo-predictor",
        "stride:8",
    ])
    .unwrap();
    assert_eq!(p.pmo.unwrap().predictor, PredictorSpec::Stride(8));
    // A name that is no predictor, or no design, is refused here, naming what is accepted.
    let e = with(&[
        "--pmo-store",
        &format!("{store},1G"),
        "--pmo-predictor",
        "psychic",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--pmo-predictor") && e.contains("\"psychic\"") && e.contains("adaptive"),
        "{e}"
    );
    let e = with(&["--pmo-store", &format!("{store},1G"), "--pmo-design", "D"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--pmo-design") && e.contains("\"D\"") && e.contains("sp-id"),
        "{e}"
    );
    // Every PMO setting may come from the file too, paths relative to it; flags win.
    std::fs::write(
        s.path("pmo.toml"),
        "kernel = \"bzImage\"\npmo_store = \"store.img,1G\"\npmo_predictor = \"adaptive\"\n\
         pmo_window = 67108864\npmo_anchor = \"anchor\"\n",
    )
    .unwrap();
    let f = VmConfig::from_args(&args(&["--config", &s.arg("pmo.toml")]))
        .unwrap()
        .pmo
        .unwrap();
    assert_eq!(f.store, s.path("store.img"));
    assert_eq!(f.predictor, PredictorSpec::Adaptive(32));
    assert_eq!(f.window_size, 64 * MIB);
    assert_eq!(f.store_options.anchor, Some(s.path("anchor")));
    let f = VmConfig::from_args(&args(&[
        "--config",
        &s.arg("pmo.toml"),
        "--pmo-predictor",
        "none",
    ]))
    .unwrap();
    assert_eq!(f.pmo.unwrap().predictor, PredictorSpec::None);
    let anchor = s.arg("anchor");
    let k = with(&[
        "--pmo-store",
        &format!("{store},1G"),
        "--pmo-kdf",
        "m=8M,t=1",
        "--pmo-anchor",
        &anchor,
    ])
    .unwrap()
    .pmo
    .unwrap();
    assert_eq!(
        k.store_options.kdf,
        KdfParams {
            m_kib: 8192,
            t: 1,
            p: 1
        }
    );
    assert_eq!(k.store_options.anchor, Some(s.path("anchor")));
    assert!(matches!(
        with(&["--pmo-store", &format!("{store},1G"), "--pmo-kdf", "t=99"]).unwrap_err(),
        ConfigError::PmoKdf(_)
    ));
    assert!(matches!(
        with(&["--pmo-kdf", "fast"]).unwrap_err(),
        ConfigError::PmoWithoutStore
    ));
}

#[test]
fn cxl_t3_options() {
    let s = Scratch::new("cxl");
    let k = s.arg("bzImage");
    s.file("key", 32);
    let ok = VmConfig::from_args(&args(&[
        "--kernel",
        &k,
        "--cxl-t3",
        &format!("media={},size=1G", s.arg("a.img")),
        "--cxl-t3",
        &format!(
            "media={},size=512M,lsa={},cache=8M,ways=4,latency=0,devmem-latency=750,key={},serial=0x1f",
            s.arg("b.img"),
            s.arg("b.labels"),
            s.arg("key")
        ),
    ]))
    .unwrap();
    assert_eq!(
        ok.cxl_t3,
        vec![
            CxlT3Config {
                media: s.path("a.img"),
                size: GIB,
                lsa: s.path("a.img.lsa"),
                cache: DEFAULT_CXL_CACHE,
                ways: DEFAULT_CXL_WAYS,
                latency_ns: DEFAULT_CXL_LATENCY_NS,
                devmem_latency_ns: DEFAULT_CXL_DEVMEM_LATENCY_NS,
                key: None,
                serial: None,
                id: None,
                guest: true,
            },
            CxlT3Config {
                media: s.path("b.img"),
                size: 512 * MIB,
                lsa: s.path("b.labels"),
                cache: 8 * MIB,
                ways: 4,
                latency_ns: 0,
                devmem_latency_ns: 750,
                key: Some(s.path("key")),
                serial: Some(0x1f),
                id: None,
                guest: true,
            },
        ]
    );
    let media = s.arg("c.img");
    let e = |opt: &str| err(&["--kernel", &k, "--cxl-t3", opt]);
    assert_eq!(
            e(&format!("media={media},size=100M")),
            format!("invalid cxl-t3 \"media={media},size=100M\": size 100M: must be a non-zero multiple of 256M")
        );
    assert_eq!(
        e(&format!("media={media}")),
        format!("invalid cxl-t3 \"media={media}\": missing size")
    );
    assert!(e(&format!("media={media},size=1G,colour=red")).contains("unknown key \"colour\""));
    assert!(e(&format!("media={media},size=1G,ways=0")).contains("ways \"0\""));
    assert!(e(&format!("media={media},size=1G,cache=6K")).contains("cache 6K"));
    assert!(e(&format!("media={media},size=1G,cache=12K,ways=8")).contains("does not divide"));
    assert!(e(&format!("media={media},size=1G,latency=x")).contains("latency \"x\""));
    assert!(e(&format!("media={media},size=1G,serial=0xg")).contains("serial \"0xg\""));
    assert!(
        e(&format!("media={media},size=1G,key={}", s.arg("nokey"))).starts_with("cxl-t3 key file")
    );
    assert!(e("size=1G").contains("missing media"));
    let twice = format!("media={media},size=1G");
    assert_eq!(
        err(&["--kernel", &k, "--cxl-t3", &twice, "--cxl-t3", &twice]),
        format!("cxl-t3 media {media}: given twice")
    );
    // The TOML file takes the same strings, paths relative to it.
    std::fs::write(
        s.path("vm.toml"),
        "kernel = \"bzImage\"\ncxl_t3 = [\"media=a.img,size=1G\"]\n",
    )
    .unwrap();
    let t = VmConfig::from_args(&args(&["--config", &s.arg("vm.toml")])).unwrap();
    assert_eq!(t.cxl_t3, ok.cxl_t3[..1].to_vec());
}

#[test]
fn pmo_store_on_a_private_expander() {
    let s = Scratch::new("pmo-cxl");
    let k = s.arg("bzImage");
    s.file("master", 32);
    let media = s.arg("m.img");
    let private = format!("media={media},size=256M,id=store,guest=off");
    let master = s.arg("master");
    let run = |extra: &[&str]| {
        let mut a = vec!["--kernel", k.as_str()];
        a.extend_from_slice(extra);
        VmConfig::from_args(&args(&a))
    };
    let ok = run(&[
        "--cxl-t3",
        &private,
        "--pmo-store",
        "cxl=store",
        "--pmo-master-key",
        &master,
    ])
    .unwrap();
    assert_eq!(
        ok.pmo_on_cxl,
        Some(PmoOnCxl {
            expander: 0,
            master_key: s.path("master"),
            cipher: RangeCipher::Xts256,
            direct: None,
        })
    );
    assert_eq!(ok.pmo.as_ref().unwrap().store_options.len, None);
    let direct = run(&[
        "--cxl-t3",
        &private,
        "--pmo-store",
        "cxl=store,direct=64M",
        "--pmo-master-key",
        &master,
    ])
    .unwrap();
    assert_eq!(direct.pmo_on_cxl.unwrap().direct, Some(64 << 20));
    assert_eq!(direct.pmo.unwrap().store_options.len, Some(192 << 20));
    for bad in ["direct=0", "direct=3M", "direct=248M", "direct=1G"] {
        let msg = run(&[
            "--cxl-t3",
            &private,
            "--pmo-store",
            &format!("cxl=store,{bad}"),
            "--pmo-master-key",
            &master,
        ])
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("leaving at least 16M of the 256M expander"),
            "{bad}: {msg}"
        );
    }
    let xts128 = run(&[
        "--cxl-t3",
        &private,
        "--pmo-store",
        "cxl=store,cipher=xts-128",
        "--pmo-master-key",
        &master,
    ])
    .unwrap();
    assert_eq!(xts128.pmo_on_cxl.unwrap().cipher, RangeCipher::Xts128);
    let pmo = ok.pmo.unwrap();
    assert_eq!((pmo.store, pmo.store_size), (s.path("m.img"), None));
    assert!(!ok.cxl_t3[0].guest);
    assert_eq!(ok.cxl_t3[0].id.as_deref(), Some("store"));

    let e = |extra: &[&str]| run(extra).unwrap_err().to_string();
    assert_eq!(
        e(&["--cxl-t3", &private, "--pmo-store", "cxl=store"]),
        "--pmo-store cxl=NAME needs --pmo-master-key FILE"
    );
    assert_eq!(
        e(&[
            "--cxl-t3",
            &private,
            "--pmo-store",
            "cxl=other",
            "--pmo-master-key",
            &master
        ]),
        "--pmo-store cxl=other: no --cxl-t3 has id=other"
    );
    let shown = format!("media={media},size=256M,id=store");
    assert_eq!(
        e(&[
            "--cxl-t3",
            &shown,
            "--pmo-store",
            "cxl=store",
            "--pmo-master-key",
            &master
        ]),
        "--pmo-store cxl=store: the guest sees that expander; give it guest=off"
    );
    assert_eq!(
        e(&["--cxl-t3", &private]),
        format!(
            "cxl-t3 media {media}: kept from the guest (guest=off) but no --pmo-store cxl= uses it"
        )
    );
    let store = s.arg("s.img");
    assert_eq!(
        e(&[
            "--pmo-store",
            &format!("{store},1G"),
            "--pmo-master-key",
            &master
        ]),
        "--pmo-master-key is for a PMO store on an expander (--pmo-store cxl=NAME)"
    );
    assert!(e(&["--pmo-master-key", &master]).contains("need --pmo-store"));
    assert!(e(&[
        "--cxl-t3",
        &private,
        "--pmo-store",
        "cxl=store,size=1G",
        "--pmo-master-key",
        &master
    ])
    .contains("no file or size"));
    assert!(e(&[
        "--cxl-t3",
        &private,
        "--pmo-store",
        "cxl=store,cipher=xts-512",
        "--pmo-master-key",
        &master
    ])
    .contains("cipher \"xts-512\" is not xts-128 or xts-256"));
    assert!(e(&["--pmo-store", &format!("{store},1G,cipher=xts-128")])
        .contains("cipher= is for a store on an expander"));
    assert!(e(&["--pmo-store", &format!("{store},1G,direct=64M")])
        .contains("direct= is for a store on an expander"));
    assert!(e(&[
        "--cxl-t3",
        &private,
        "--pmo-store",
        "cxl=store",
        "--pmo-master-key",
        &s.arg("nokey")
    ])
    .starts_with("PMO master key file"));
    let opt = |o: &str| e(&["--cxl-t3", &format!("media={media},size=256M,{o}")]);
    assert!(opt("guest=maybe").contains("guest \"maybe\" is not on or off"));
    assert!(opt("id=a/b").contains("id \"a/b\""));
    assert!(opt(&format!("id={}", "x".repeat(33))).contains("is not 1 to 32"));
    assert!(opt(&format!("guest=off,id=s,key={master}")).contains("--pmo-master-key"));
    let other = format!("media={},size=256M,id=store", s.arg("n.img"));
    assert_eq!(
        e(&["--cxl-t3", &shown, "--cxl-t3", &other]),
        "cxl-t3 id=store: given twice"
    );
}

#[test]
fn pmo_dram_budget_needs_an_expander_store_and_whole_pages() {
    let s = Scratch::new("pmo-dram");
    let k = s.arg("bzImage");
    s.file("master", 32);
    let private = format!("media={},size=256M,id=store,guest=off", s.arg("m.img"));
    let master = s.arg("master");
    let run = |dram: &str| {
        VmConfig::from_args(&args(&[
            "--kernel",
            &k,
            "--cxl-t3",
            &private,
            "--pmo-store",
            "cxl=store",
            "--pmo-master-key",
            &master,
            "--pmo-window",
            "64M",
            "--pmo-dram",
            dram,
        ]))
    };
    let budget = |dram: &str| run(dram).unwrap().pmo.unwrap().dram_budget.unwrap();
    assert_eq!(
        budget("16M"),
        DramBudget {
            bytes: 16 << 20,
            placement: PlacementPolicy::Hotness,
        }
    );
    assert_eq!(
        budget("size=4K,policy=fifo").placement,
        PlacementPolicy::Fifo
    );
    assert_eq!(budget("64M").bytes, 64 << 20, "the whole window");
    let e = |dram: &str| run(dram).unwrap_err().to_string();
    for bad in ["0", "6000", "65M"] {
        assert!(
            e(bad).contains("not a non-zero multiple of 4K within the PMO window"),
            "{bad}: {}",
            e(bad)
        );
    }
    assert!(e("16M,policy=lru").contains("unknown placement policy \"lru\""));
    assert!(e("16M,colour=red").contains("colour"));
    let file_store = s.arg("s.img");
    let e = VmConfig::from_args(&args(&[
        "--kernel",
        &k,
        "--pmo-store",
        &format!("{file_store},1G"),
        "--pmo-dram",
        "16M",
    ]))
    .unwrap_err();
    assert!(matches!(e, ConfigError::PmoDramWithoutCxl), "{e}");
    let e = VmConfig::from_args(&args(&["--kernel", &k, "--pmo-dram", "16M"])).unwrap_err();
    assert!(matches!(e, ConfigError::PmoWithoutStore), "{e}");
}

#[test]
fn cxl_designs_need_a_store_on_an_expander() {
    let s = Scratch::new("cxl-design");
    let k = s.arg("bzImage");
    s.file("master", 32);
    let store = s.arg("s.img");
    for d in ["c", "cl", "cf"] {
        let e = VmConfig::from_args(&args(&[
            "--kernel",
            &k,
            "--pmo-store",
            &format!("{store},64M"),
            "--pmo-design",
            d,
        ]))
        .unwrap_err();
        assert!(matches!(e, ConfigError::PmoDesignWithoutCxl(_)), "{e}");
        assert!(e.to_string().contains("--pmo-store cxl=NAME"), "{e}");
    }
    let private = format!("media={},size=256M,id=s,guest=off", s.arg("m.img"));
    for d in ["c", "cl", "cf", "d"] {
        let cfg = VmConfig::from_args(&args(&[
            "--kernel",
            &k,
            "--cxl-t3",
            &private,
            "--pmo-store",
            "cxl=s",
            "--pmo-master-key",
            &s.arg("master"),
            "--pmo-design",
            d,
        ]))
        .unwrap();
        assert_eq!(cfg.pmo.unwrap().design.map(|d| d.name()), Some(d));
    }
}
