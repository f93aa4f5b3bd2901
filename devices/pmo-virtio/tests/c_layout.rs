//! The C and Rust sides of the virtio-pmo protocol agree.
//!
//! Layouts and constants, mechanically: the test reads `guest/include/uapi/virtio_pmo.h` (the
//! header the guest driver and libpmo use), lists every structure with its fields and every
//! constant in it, generates a C program that prints what the compiler makes of each (`sizeof`,
//! `offsetof`, values), and compares that with `proto::wire::LAYOUTS` and the Rust constants.
//! A structure, field or constant on one side only, or a name, offset, size or value that
//! differs, fails here; `a_field_on_one_side_only_is_caught` shows the check failing.
//!
//! Values: `c_layout.c` builds requests and answers in C; the Rust side parses or decodes them
//! and compares what each field means.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use pmo_store::Perm;
use pmo_virtio::proto::{self, wire, Request, Status};

fn uapi_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/include/uapi")
}

fn header() -> String {
    std::fs::read_to_string(uapi_dir().join("virtio_pmo.h")).unwrap()
}

/// A scratch directory of its own per call: the tests run in parallel.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("pmo-c-layout-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles `source` with `include` on the include path, runs it, returns its output.
fn compile_and_run(source: &Path, include: &Path, dir: &Scratch) -> String {
    let exe = dir.0.join("prog");
    let out = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(include)
        .arg(source)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("a C compiler (cc) is needed: scripts/setup.sh installs gcc");
    assert!(
        out.status.success(),
        "{} does not compile against virtio_pmo.h:\n{}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    String::from_utf8(run.stdout).unwrap()
}

/// The header without its comments.
fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i..].split_once("*/").map_or("", |(_, r)| r);
    }
    out.push_str(rest);
    out
}

/// Every `struct TAG { ... }` the header defines, with its field names in order.
fn c_struct_fields(header: &str) -> Vec<(String, Vec<String>)> {
    let text = strip_comments(header);
    let mut found = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("struct ") {
        rest = &rest[i + "struct ".len()..];
        let tag_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let (tag, after) = rest.split_at(tag_len);
        let Some(body) = after.trim_start().strip_prefix('{') else {
            continue; // a use of the type, not its definition
        };
        let end = body.find('}').unwrap();
        let fields = body[..end]
            .split(';')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|decl| {
                let decl = decl.split('[').next().unwrap();
                decl.split_whitespace().last().unwrap().to_string()
            })
            .collect();
        found.push((tag.to_string(), fields));
        rest = &body[end..];
    }
    found
}

/// Every constant the header defines: `#define VIRTIO_...` with a value, and enum members.
fn c_constants(header: &str) -> Vec<String> {
    let text = strip_comments(header);
    let mut names = Vec::new();
    for line in text.lines() {
        if let Some(def) = line.trim().strip_prefix("#define") {
            let mut words = def.split_whitespace();
            if let (Some(name), Some(_value)) = (words.next(), words.next()) {
                if name.starts_with("VIRTIO_") && !name.contains('(') {
                    names.push(name.to_string());
                }
            }
        }
    }
    let mut rest = text.as_str();
    while let Some(i) = rest.find("enum ") {
        rest = &rest[i..];
        let (Some(open), Some(close)) = (rest.find('{'), rest.find('}')) else {
            break;
        };
        for member in rest[open + 1..close].split(',') {
            if let Some((name, _)) = member.split_once('=') {
                names.push(name.trim().to_string());
            }
        }
        rest = &rest[close..];
    }
    names
}

/// A field as the compiler lays it out: (name, offsetof, sizeof).
type CField = (String, usize, usize);

/// What the C compiler makes of a header: its structures' layouts and its constants' values.
#[derive(Debug, Default)]
struct CSide {
    /// Tag -> (sizeof, fields).
    structs: BTreeMap<String, (usize, Vec<CField>)>,
    consts: BTreeMap<String, i64>,
}

/// Asks the compiler about every structure and constant of `header_text` (placed as
/// `virtio_pmo.h` in a scratch directory, so tests can hand in an edited copy).
fn c_side_of(header_text: &str) -> CSide {
    let dir = Scratch::new();
    std::fs::write(dir.0.join("virtio_pmo.h"), header_text).unwrap();
    let mut prog = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"virtio_pmo.h\"\n\nint main(void)\n{\n",
    );
    for (tag, fields) in c_struct_fields(header_text) {
        prog += &format!("\tprintf(\"struct {tag} %zu\\n\", sizeof(struct {tag}));\n");
        for f in fields {
            prog += &format!(
                "\tprintf(\"field {tag} {f} %zu %zu\\n\", offsetof(struct {tag}, {f}), \
                 sizeof(((struct {tag} *)0)->{f}));\n"
            );
        }
    }
    for c in c_constants(header_text) {
        prog += &format!("\tprintf(\"const {c} %lld\\n\", (long long)({c}));\n");
    }
    prog += "\treturn 0;\n}\n";
    let src = dir.0.join("layout.c");
    std::fs::write(&src, prog).unwrap();
    let mut side = CSide::default();
    for line in compile_and_run(&src, &dir.0, &dir).lines() {
        let w: Vec<&str> = line.split(' ').collect();
        match w.as_slice() {
            ["struct", tag, size] => {
                side.structs
                    .insert(tag.to_string(), (size.parse().unwrap(), Vec::new()));
            }
            ["field", tag, name, off, size] => {
                let s = side.structs.get_mut(*tag).unwrap();
                s.1.push((
                    name.to_string(),
                    off.parse().unwrap(),
                    size.parse().unwrap(),
                ));
            }
            ["const", name, v] => {
                side.consts.insert(name.to_string(), v.parse().unwrap());
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    side
}

/// Every difference between the C structures and the Rust wire layouts.
fn mismatches(c: &CSide, rust: &[wire::Layout]) -> Vec<String> {
    let mut out = Vec::new();
    for l in rust {
        let Some((size, fields)) = c.structs.get(l.c_name) else {
            out.push(format!("{}: in Rust only", l.c_name));
            continue;
        };
        if *size != l.size {
            out.push(format!("{}: C {} bytes, Rust {}", l.c_name, size, l.size));
        }
        let rust_fields: Vec<CField> = l
            .fields
            .iter()
            .map(|f| (f.name.to_string(), f.offset, f.size))
            .collect();
        if *fields != rust_fields {
            out.push(format!(
                "{}: fields (name, offset, size) differ\n  C:    {fields:?}\n  Rust: {rust_fields:?}",
                l.c_name
            ));
        }
    }
    for tag in c.structs.keys() {
        if !rust.iter().any(|l| l.c_name == tag) {
            out.push(format!("{tag}: in C only"));
        }
    }
    out
}

/// The C name of each status.
fn status_name(s: Status) -> &'static str {
    match s {
        Status::Ok => "OK",
        Status::Perm => "PERM",
        Status::NoEnt => "NOENT",
        Status::Io => "IO",
        Status::NoMem => "NOMEM",
        Status::Access => "ACCES",
        Status::Busy => "BUSY",
        Status::Exist => "EXIST",
        Status::Inval => "INVAL",
        Status::NoSpc => "NOSPC",
        Status::NameTooLong => "NAMETOOLONG",
        Status::NoSys => "NOSYS",
        Status::Proto => "PROTO",
        Status::BadMsg => "BADMSG",
        Status::Stale => "STALE",
    }
}

/// Every constant of the protocol by its C name, from the Rust side.
fn rust_constants() -> BTreeMap<String, i64> {
    let mut m: BTreeMap<String, i64> = [
        ("VIRTIO_ID_PMO", i64::from(proto::VIRTIO_ID_PMO)),
        ("VIRTIO_PMO_VERSION", i64::from(proto::VERSION)),
        ("VIRTIO_PMO_NAME_FIELD", proto::NAME_FIELD as i64),
        ("VIRTIO_PMO_NAME_MAX", proto::MAX_NAME_LEN as i64),
        ("VIRTIO_PMO_KEY_FIELD", proto::KEY_FIELD as i64),
        ("VIRTIO_PMO_DESIGN_FIELD", proto::DESIGN_FIELD as i64),
        ("VIRTIO_PMO_HIST_BUCKETS", proto::HIST_BUCKETS as i64),
        ("VIRTIO_PMO_OP_CREATE", i64::from(proto::OP_CREATE)),
        ("VIRTIO_PMO_OP_DESTROY", i64::from(proto::OP_DESTROY)),
        ("VIRTIO_PMO_OP_ATTACH", i64::from(proto::OP_ATTACH)),
        ("VIRTIO_PMO_OP_DETACH", i64::from(proto::OP_DETACH)),
        ("VIRTIO_PMO_OP_PSYNC", i64::from(proto::OP_PSYNC)),
        ("VIRTIO_PMO_OP_STAT", i64::from(proto::OP_STAT)),
        ("VIRTIO_PMO_OP_SET_DESIGN", i64::from(proto::OP_SET_DESIGN)),
        ("VIRTIO_PMO_OP_LIST", i64::from(proto::OP_LIST)),
        // The permissions on the wire are what parse() maps to Read and Write (checked below).
        ("VIRTIO_PMO_PERM_READ", 1),
        ("VIRTIO_PMO_PERM_WRITE", 2),
        ("VIRTIO_PMO_LIST_DETACHED", i64::from(proto::LIST_DETACHED)),
        ("VIRTIO_PMO_LIST_READERS", i64::from(proto::LIST_READERS)),
        ("VIRTIO_PMO_LIST_WRITER", i64::from(proto::LIST_WRITER)),
        (
            "VIRTIO_PMO_EVENT_PAGE_POISONED",
            i64::from(proto::EVENT_PAGE_POISONED),
        ),
        (
            "VIRTIO_PMO_EVENT_PAGE_BAD",
            i64::from(proto::EVENT_PAGE_BAD),
        ),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect();
    for s in Status::ALL {
        m.insert(format!("VIRTIO_PMO_S_{}", status_name(s)), s as i64);
    }
    m
}

#[test]
fn every_structure_agrees_field_by_field() {
    let text = header();
    let c = c_side_of(&text);
    let bad = mismatches(&c, wire::LAYOUTS);
    assert!(
        bad.is_empty(),
        "virtio_pmo.h and proto/wire.rs differ:\n{}",
        bad.join("\n")
    );
    // Not vacuous: every structure of the header was found and compared.
    assert_eq!(c.structs.len(), wire::LAYOUTS.len());
    assert_eq!(
        text.matches("} __attribute__((packed));").count(),
        c.structs.len()
    );
    let (size, fields) = &c.structs["virtio_pmo_stat"];
    assert_eq!(*size, proto::StatResponse::LEN);
    assert_eq!(fields.len(), 16);
    assert_eq!(
        fields[15],
        ("tier".to_string(), 8 * 30, proto::TierStat::LEN)
    );
}

#[test]
fn a_field_on_one_side_only_is_caught() {
    let text = header();
    // C only: a counter added to STAT, or one renamed.
    let anchor = "\tstruct virtio_pmo_tier_stat tier;";
    assert!(text.contains(anchor));
    let added = text.replace(anchor, &format!("\t__le64 extra;\n{anchor}"));
    let bad = mismatches(&c_side_of(&added), wire::LAYOUTS);
    assert!(
        bad.iter()
            .any(|m| m.contains("virtio_pmo_stat") && m.contains("extra")),
        "{bad:?}"
    );
    let renamed = text.replace("__le64 trigger_hits;", "__le64 trigger_used;");
    let bad = mismatches(&c_side_of(&renamed), wire::LAYOUTS);
    assert!(bad.iter().any(|m| m.contains("trigger_used")), "{bad:?}");
    // Rust only: a structure's table with one more field.
    let c = c_side_of(&text);
    let stat = proto::StatResponse::LAYOUT;
    let mut fields = stat.fields.to_vec();
    fields.push(wire::Field {
        name: "extra",
        offset: stat.size,
        size: 8,
    });
    let grown = wire::Layout {
        size: stat.size + 8,
        fields: Box::leak(fields.into_boxed_slice()),
        ..stat
    };
    let rust: Vec<wire::Layout> = wire::LAYOUTS
        .iter()
        .map(|l| if l.c_name == stat.c_name { grown } else { *l })
        .collect();
    let bad = mismatches(&c, &rust);
    assert!(bad.iter().any(|m| m.contains("extra")), "{bad:?}");
}

#[test]
fn every_constant_agrees() {
    let text = header();
    let c = c_side_of(&text);
    assert_eq!(c.consts, rust_constants());
    assert_eq!(
        proto::MAX_NAME_LEN,
        pmo_store::record::MAX_NAME,
        "the store's name limit is the protocol's"
    );
    // A constant added to the header alone is caught too.
    let more = text.replace(
        "#define VIRTIO_PMO_PERM_READ",
        "#define VIRTIO_PMO_PERM_EXEC\t\t4\n#define VIRTIO_PMO_PERM_READ",
    );
    assert_ne!(c_side_of(&more).consts, rust_constants());
}

/// The structures `c_layout.c` built and printed, by name.
fn c_values() -> BTreeMap<String, Vec<u8>> {
    let dir = Scratch::new();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c_layout.c");
    let mut structs = BTreeMap::new();
    for line in compile_and_run(&src, &uapi_dir(), &dir).lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let ["struct", name, len, hex] = f.as_slice() else {
            panic!("unexpected line {line:?}");
        };
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(bytes.len(), len.parse::<usize>().unwrap());
        structs.insert(name.to_string(), bytes);
    }
    structs
}

#[test]
fn requests_built_by_c_parse_to_their_fields() {
    let s = c_values();
    assert_eq!(s["create"].len(), proto::MAX_REQUEST_LEN);
    match proto::parse(&s["create"]).unwrap() {
        Request::Create { name, size, key } => {
            assert_eq!(name, "layout-create");
            assert_eq!(size, 0x2122_2324_2526_2728);
            assert_eq!(&key[..], b"k3y-create");
        }
        r => panic!("{r:?}"),
    }
    match proto::parse(&s["destroy"]).unwrap() {
        Request::Destroy { name, key } => {
            assert_eq!(name, "layout-destroy");
            assert_eq!(&key[..], b"k3y-destroy");
        }
        r => panic!("{r:?}"),
    }
    match proto::parse(&s["attach"]).unwrap() {
        Request::Attach { name, perm, key } => {
            assert_eq!(name, "layout-attach");
            assert_eq!(perm, Perm::Write);
            assert_eq!(&key[..], b"k3y-attach");
        }
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        proto::parse(&s["psync"]).unwrap(),
        Request::Psync {
            handle: 0x3132_3334_3536_3738
        }
    ));
    assert!(matches!(
        proto::parse(&s["set_design"]).unwrap(),
        Request::SetDesign { design } if design == pmo_store::Design::SpId
    ));
    assert!(matches!(
        proto::parse(&s["list"]).unwrap(),
        Request::List { index: 0x4142_4344 }
    ));
}

#[test]
fn answers_built_by_c_decode_to_their_fields() {
    let s = c_values();
    assert_eq!(
        proto::DeviceConfig::decode(&s["virtio_pmo_config"]),
        Some(proto::DeviceConfig {
            version: 1,
            page_size: 4096,
            window_size: 0x0102_0304_0506_0708,
            max_name_len: 63,
            max_key_len: 64,
            max_pmo_size: 0x1112_1314_1516_1718,
        })
    );
    assert_eq!(
        &proto::response(Status::BadMsg, &[0; 0x2a])[..proto::HEADER_LEN],
        &s["virtio_pmo_resp_hdr"][..]
    );
    assert_eq!(
        proto::AttachResponse::decode(&s["virtio_pmo_attach_resp"]),
        Some(proto::AttachResponse {
            handle: 0x5152_5354_5556_5758,
            window_offset: 0x6162_6364_6566_6768,
            size: 0x7172_7374_7576_7778,
        })
    );
    assert_eq!(
        proto::PsyncResponse::decode(&s["virtio_pmo_psync_resp"]),
        Some(proto::PsyncResponse {
            pages_written: 0x8182_8384_8586_8788
        })
    );
    assert_eq!(
        proto::ListEntry::decode(&s["virtio_pmo_list_resp"]),
        Some(proto::ListEntry {
            name: "layout-list".into(),
            size: 0xa1a2_a3a4_a5a6_a7a8,
            attached: proto::LIST_READERS,
            more: 1,
        })
    );
    assert_eq!(
        proto::Event::decode(&s["virtio_pmo_event"]),
        Some(proto::Event {
            kind: proto::EVENT_PAGE_BAD,
            handle: 0xb1b2_b3b4_b5b6_b7b8,
            page: 0xc1c2_c3c4_c5c6_c7c8,
        })
    );
    // And the other way: what the device writes is byte for byte what C would.
    assert_eq!(
        proto::Event::decode(&s["virtio_pmo_event"])
            .unwrap()
            .encode()[..],
        s["virtio_pmo_event"][..]
    );
}
