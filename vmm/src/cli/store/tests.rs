use super::*;
use cxl_t3::expander::{Expander, ExpanderConfig};
use pmo_crypto::RangeCipher;

#[test]
fn a_small_store_gets_a_table_that_fits_or_is_told_the_smallest_size() {
    let dir = std::env::temp_dir().join(format!("pmo-cli-small-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let path = dir.join("64m");
    let sb = store_create(
        StoreFile::plain(&path),
        Some(64 << 20),
        None,
        &mut out,
        &mut err,
    )
    .unwrap();
    assert_eq!(sb.slots, 8192, "one slot per 8 KiB of the store");
    let path = dir.join("64m-full-table");
    let e = store_create(
        StoreFile::plain(&path),
        Some(64 << 20),
        Some(65_536),
        &mut out,
        &mut err,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("needs at least 68 MiB"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cli_flow_on_a_sparse_file() {
    let dir = std::env::temp_dir().join(format!("pmo-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store");
    let keyf = dir.join("key");
    std::fs::write(&keyf, b"cli-key\n").unwrap();
    let key = read_key_file(&keyf).unwrap();
    let sf = StoreFile::plain(&path);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    store_create(sf, Some(1 << 30), Some(1024), &mut out, &mut err).unwrap();
    assert!(String::from_utf8_lossy(&err).contains("100%"));
    pmo_create(
        sf,
        "db",
        16 << 20,
        &key,
        CreateOptions {
            kdf: Some(pmo_crypto::KdfParams::INSECURE_FAST),
            ..CreateOptions::default()
        },
        &mut out,
    )
    .unwrap();
    let list = store_ls(sf, &mut out).unwrap();
    assert_eq!(list.len(), 1);
    let ins = store_inspect(&path, &mut out).unwrap();
    assert_eq!(ins.records.len(), 1);
    store_fsck(sf, &mut out, &mut err).unwrap();
    assert!(store_verify(sf, "db", &key, &mut out, &mut err)
        .unwrap()
        .is_empty());
    // Tamper with the file: one byte of the PMO's first page, after writing it.
    {
        let (open, _) = open_store(sf).unwrap();
        let s = &open.store;
        let w = s.attach("db", pmo_store::Perm::Write, &key).unwrap();
        w.psync([(0u64, &[9u8; pmo_crypto::PAGE])]).unwrap();
        w.detach().wait().unwrap();
        let off = s.list()[0].extent.0 + 100;
        let mut b = [0u8; 1];
        s.medium().read(off, &mut b).unwrap();
        s.medium().write(off, &[b[0] ^ 0xff]).unwrap();
        s.medium().persist(off, 1).unwrap();
    }
    assert!(matches!(
        store_verify(sf, "db", &key, &mut out, &mut err),
        Err(StoreCliError::Unclean(1))
    ));
    assert!(matches!(
        store_destroy(sf, "db", &UserKey::new(b"bad").unwrap(), &mut out),
        Err(StoreCliError::Store(StoreError::WrongKey))
    ));
    store_destroy(sf, "db", &key, &mut out).unwrap();
    assert!(store_ls(sf, &mut out).unwrap().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The store commands on CXL expander media: told apart from store files by the media
/// header, keyed from a master key, no plaintext on the media, tampering found by verify,
/// and another cipher derives other keys (every page then fails).
#[test]
fn cli_flow_on_expander_media() {
    let dir = std::env::temp_dir().join(format!("pmo-cli-cxl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let media = dir.join("media");
    let x = Expander::open(&ExpanderConfig::new(&media, 256 << 20)).unwrap();
    x.shutdown().unwrap();
    drop(x);
    let master = dir.join("master");
    std::fs::write(&master, [0x5au8; 32]).unwrap();
    let keyf = dir.join("key");
    std::fs::write(&keyf, b"cxl-cli-key\n").unwrap();
    let key = read_key_file(&keyf).unwrap();
    let keyed = |cipher| StoreFile {
        path: &media,
        anchor: None,
        cxl: Some(CxlAccess {
            master_key: &master,
            cipher,
        }),
    };
    let sf = keyed(RangeCipher::Xts256);
    let (mut out, mut err) = (Vec::new(), Vec::new());

    let e = store_create(StoreFile::plain(&media), None, None, &mut out, &mut err);
    assert!(matches!(e, Err(StoreCliError::NeedsMasterKey(_))), "{e:?}");
    let e = store_create(sf, Some(1 << 30), None, &mut out, &mut err);
    assert!(matches!(e, Err(StoreCliError::MediaSize { .. })), "{e:?}");
    let sb = store_create(sf, Some(256 << 20), None, &mut out, &mut err).unwrap();
    assert_eq!(sb.medium_len, 256 << 20, "the store spans the DPA space");
    let e = store_create(sf, None, None, &mut out, &mut err);
    assert!(matches!(e, Err(StoreCliError::MediaNotBlank(_))), "{e:?}");
    let plain_file = dir.join("plain");
    std::fs::write(&plain_file, b"x").unwrap();
    let e = store_ls(
        StoreFile {
            path: &plain_file,
            ..sf
        },
        &mut out,
    );
    assert!(matches!(e, Err(StoreCliError::NotMedia(_))), "{e:?}");
    let e = store_ls(StoreFile::plain(&media), &mut out);
    assert!(matches!(e, Err(StoreCliError::NeedsMasterKey(_))), "{e:?}");

    let fast = CreateOptions {
        kdf: Some(KdfParams::INSECURE_FAST),
        ..CreateOptions::default()
    };
    pmo_create(sf, "ledger", 1 << 20, &key, fast, &mut out).unwrap();
    // LPMO's design C: no software cipher, the range key alone keeps it off the media.
    let design_c = CreateOptions {
        design: Design::C,
        suite: None,
        ..fast
    };
    pmo_create(sf, "cpmo", 1 << 20, &key, design_c, &mut out).unwrap();
    let marker = *b"PLAINTEXT-MARKER-ON-CXL-0123456789";
    {
        let (open, _) = open_store(sf).unwrap();
        for name in ["ledger", "cpmo"] {
            let w = open
                .store
                .attach(name, pmo_store::Perm::Write, &key)
                .unwrap();
            let mut page = [0u8; pmo_crypto::PAGE];
            page[..marker.len()].copy_from_slice(&marker);
            w.psync([(3u64, &page)]).unwrap();
            w.detach().wait().unwrap();
        }
        open.close().unwrap();
    }
    let list = store_ls(sf, &mut out).unwrap();
    assert_eq!(list.len(), 2);
    let c = list.iter().find(|p| p.name == "cpmo").unwrap();
    assert_eq!((c.design, c.suite), (Design::C, Suite::TeeBlake3));
    assert!(store_verify(sf, "cpmo", &key, &mut out, &mut err)
        .unwrap()
        .is_empty());
    let list: Vec<_> = list.into_iter().filter(|p| p.name == "ledger").collect();
    let ins = store_inspect(&media, &mut out).unwrap();
    assert_eq!(ins.records.len(), 2, "inspect reads the keyless metadata");
    assert_eq!(ins.superblock.medium_len, 256 << 20);
    store_fsck(sf, &mut out, &mut err).unwrap();
    assert!(store_verify(sf, "ledger", &key, &mut out, &mut err)
        .unwrap()
        .is_empty());
    let raw = std::fs::read(&media).unwrap();
    // SAFETY: both pointers and lengths describe live slices.
    let found = unsafe {
        libc::memmem(
            raw.as_ptr().cast(),
            raw.len(),
            marker.as_ptr().cast(),
            marker.len(),
        )
    };
    assert!(found.is_null(), "plaintext on the media");

    // Another cipher derives other range keys: the pages read as garbage and fail.
    let e = store_verify(
        keyed(RangeCipher::Xts128),
        "ledger",
        &key,
        &mut out,
        &mut err,
    );
    assert!(
        matches!(e, Err(StoreCliError::Unclean(n)) if n > 0),
        "{e:?}"
    );
    assert!(store_verify(sf, "ledger", &key, &mut out, &mut err)
        .unwrap()
        .is_empty());

    // A keyless editor flips one byte of the PMO's extent on the media.
    let off = HEADER_LEN + list[0].extent.0 + 3 * 4096 + 7;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&media)
            .unwrap();
        f.write_all_at(&[raw[off as usize] ^ 0x80], off).unwrap();
    }
    let e = store_verify(sf, "ledger", &key, &mut out, &mut err);
    assert!(matches!(e, Err(StoreCliError::Unclean(1))), "{e:?}");
    store_destroy(sf, "ledger", &key, &mut out).unwrap();
    store_destroy(sf, "cpmo", &key, &mut out).unwrap();
    assert!(store_ls(sf, &mut out).unwrap().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 27 from the host tools' side: under an anchor, a PMO whose slot was damaged is
/// listed as refused (not silently gone), fsck counts it, destroy refuses it; a store file
/// whose superblock says another length than the file is refused.
#[test]
fn the_host_tools_name_a_refused_pmo_and_refuse_an_edited_store_length() {
    let dir = std::env::temp_dir().join(format!("pmo-cli-refused-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store");
    let anchor = dir.join("anchor");
    let key = UserKey::new(b"k").unwrap();
    let sf = StoreFile {
        path: &path,
        anchor: Some(&anchor),
        cxl: None,
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    store_create(sf, Some(64 << 20), Some(16), &mut out, &mut err).unwrap();
    let fast = CreateOptions {
        kdf: Some(pmo_crypto::KdfParams::INSECURE_FAST),
        ..CreateOptions::default()
    };
    pmo_create(sf, "db", 1 << 20, &key, fast, &mut out).unwrap();
    pmo_create(sf, "other", 1 << 20, &key, fast, &mut out).unwrap();
    // Both record copies of slot 0 ("db") overwritten.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let table = 2 * pmo_store::superblock::SB_SIZE;
        f.write_all_at(&[0x5a; pmo_store::superblock::SLOT_SIZE as usize], table)
            .unwrap();
    }
    let mut ls = Vec::new();
    let list = store_ls(sf, &mut ls).unwrap();
    assert_eq!(list.len(), 1);
    let ls = String::from_utf8(ls).unwrap();
    assert!(
        ls.lines()
            .any(|l| l.starts_with("db ") && l.contains("refused: its table slot 0 is damaged")),
        "{ls}"
    );
    let mut fsck = Vec::new();
    assert!(matches!(
        store_fsck(sf, &mut fsck, &mut err),
        Err(StoreCliError::Unclean(_))
    ));
    assert!(String::from_utf8(fsck)
        .unwrap()
        .contains("problem: db: refused"));
    assert!(matches!(
        store_destroy(sf, "db", &key, &mut out),
        Err(StoreCliError::Store(StoreError::Refused { .. }))
    ));
    // The file grown behind the store's back (or its superblock edited): refused by length.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(128 << 20)
        .unwrap();
    let e = store_ls(sf, &mut out).unwrap_err().to_string();
    assert!(
        e.contains("an edited superblock (or a resized store file)"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
/// No product tool creates a suite documented as weak: `mkpmo --suite` knows the built-in
/// suites only, not the comparison harness's `paper` or no-MAC suites.
#[test]
fn mkpmo_refuses_the_benchmark_suites() {
    for ok in ["xts-blake3", "aes-gcm", "tee-blake3"] {
        assert_eq!(parse_suite(ok).unwrap().name(), ok);
    }
    for weak in ["paper", "xts-nomac-bench", "external"] {
        let e = parse_suite(weak).unwrap_err().to_string();
        assert!(e.contains("unknown suite"), "{weak}: {e}");
        assert!(!e.contains("paper,"), "{e}");
    }
}
