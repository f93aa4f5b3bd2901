//! Every repository path the documentation names exists, so docs cannot silently drift from the
//! code again (a deleted example, a split module, a renamed test file).
//!
//! What counts as a path: a `backticked` token in `README.md`, `docs/*.md`, the other READMEs of
//! the repository and the comments of its Rust files that looks like a file or directory of ours: it has a `/` and ends in a
//! known source or document extension, or in `/`. `{a,b}` alternatives are expanded. A path is
//! found when it exists from the repository root or from the document's directory, or when it is
//! the tail of a tracked file's path (docs name files relative to their crate: `src/pager/fault.rs`,
//! `tests/working.rs`). Build outputs (`target/...`), absolute paths, a lone directory name
//! (`modules/`, said of an output tree) and the quoted sources of other projects (the kernel's,
//! LMDB's: [`EXTERNAL`]) are not repository paths.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Trees the docs quote that are not ours: the Linux kernel's source (`mm/damon/sysfs.c`) and
/// LMDB's (`libraries/liblmdb/lmdb.h`, fetched by `apps/lmdb/fetch.sh`).
const EXTERNAL: &[&str] = &[
    "arch/",
    "drivers/",
    "fs/",
    "include/linux/",
    "kernel/",
    "mm/",
    "virt/",
    "libraries/liblmdb/",
];

const EXTENSIONS: &[&str] = &[
    ".rs", ".md", ".sh", ".c", ".h", ".py", ".toml", ".patch", ".list", ".txt", ".S", ".lds",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// Every tracked file and every directory that holds one, relative to the root.
fn tracked(repo: &Path) -> BTreeSet<String> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo)
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    let mut all = BTreeSet::new();
    for f in out.stdout.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        let f = String::from_utf8_lossy(f).into_owned();
        let mut dir = f.as_str();
        while let Some(i) = dir.rfind('/') {
            dir = &dir[..i];
            all.insert(format!("{dir}/"));
        }
        all.insert(f);
    }
    all
}

/// The documents to check: README.md, docs/*.md, every other README.md we wrote and our Rust
/// files (their comments), not the vendored third-party trees'.
fn documents(files: &BTreeSet<String>) -> Vec<String> {
    files
        .iter()
        .filter(|f| !f.starts_with("third_party/"))
        .filter(|f| {
            f.as_str() == "README.md"
                || (f.starts_with("docs/") && f.ends_with(".md"))
                || f.ends_with("/README.md")
                || f.ends_with(".rs")
        })
        .cloned()
        .collect()
}

/// Expands alternatives: a/{b,c}/d.rs gives a/b/d.rs and a/c/d.rs (one level of braces, possibly
/// several groups).
fn expand(token: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (token.find('{'), token.find('}')) else {
        return vec![token.to_string()];
    };
    if close < open {
        return vec![token.to_string()];
    }
    token[open + 1..close]
        .split(',')
        .flat_map(|alt| expand(&format!("{}{alt}{}", &token[..open], &token[close + 1..])))
        .collect()
}

/// The path-like tokens of one document's text.
fn paths_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, chunk) in text.split('`').enumerate() {
        // Odd chunks are inside backticks (code spans; fenced blocks split the same way and
        // are skipped by the shape test below, as they hold spaces and newlines).
        if i % 2 == 0 || chunk.contains(char::is_whitespace) || !chunk.contains('/') {
            continue;
        }
        let token = chunk.trim_end_matches([':', ',', '.', ')']);
        let token = token.split([':', '#']).next().unwrap_or(token);
        if token.starts_with('/')
            || token.starts_with("target/")
            || token.starts_with("http")
            || token.contains(['*', '<', '>', '$', '=', '\'', '"', '|', '@'])
            || token.contains("...")
            || EXTERNAL.iter().any(|e| token.starts_with(e))
            // `modules/`: one directory name, said of some output tree in the text around it.
            || (token.ends_with('/') && token.matches('/').count() == 1)
        {
            continue;
        }
        let looks_like_file = EXTENSIONS.iter().any(|e| token.ends_with(e));
        if looks_like_file || token.ends_with('/') {
            out.extend(expand(token));
        }
    }
    out
}

/// The comment text of a Rust file, one line per comment (so a backtick in code never pairs
/// with one in a comment).
fn comments(source: &str) -> String {
    source
        .lines()
        .filter_map(|l| l.find("//").map(|i| &l[i..]))
        .filter(|c| c.matches('`').count() % 2 == 0)
        .collect::<Vec<_>>()
        .join("\n")
}

fn exists(repo: &Path, doc_dir: &Path, files: &BTreeSet<String>, path: &str) -> bool {
    if repo.join(path).exists() || repo.join(doc_dir).join(path).exists() {
        return true;
    }
    let tail = path.trim_start_matches("./");
    files
        .iter()
        .any(|f| f.ends_with(&format!("/{tail}")) || f.as_str() == tail)
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let repo = repo();
    let files = tracked(&repo);
    let docs = documents(&files);
    assert!(docs.len() >= 100, "too few documents found: {docs:?}");
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(repo.join(doc)).expect("read document");
        let text = if doc.ends_with(".rs") {
            comments(&text)
        } else {
            text
        };
        let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
        for p in paths_in(&text) {
            checked += 1;
            if !exists(&repo, dir, &files, &p) {
                missing.push(format!("{doc}: `{p}`"));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths found: the scanner is broken"
    );
    assert!(
        missing.is_empty(),
        "paths named in the docs that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_scanner_finds_paths_and_expands_alternatives() {
    let t = "see `devices/cxl-t3/src/{media,cache}.rs` and `docs/store.md`, not `cargo test -p x` \
             nor `target/guest/vmlinuz` nor `a/b`";
    assert_eq!(
        paths_in(t),
        [
            "devices/cxl-t3/src/media.rs",
            "devices/cxl-t3/src/cache.rs",
            "docs/store.md"
        ]
    );
}
