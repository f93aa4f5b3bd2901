use super::*;

fn keys_with(suite: Suite, user: &[u8]) -> PmoKeys {
    let p = KeyParams::generate(suite, KdfParams::INSECURE_FAST).unwrap();
    PmoKeys::derive(&UserKey::new(user).unwrap(), p, &ExternalSuites::new()).unwrap()
}

fn keys(suite: Suite) -> PmoKeys {
    keys_with(suite, b"correct horse")
}

fn id(k: &PmoKeys, page: u32, version: u64, gen: u8) -> PageId {
    PageId {
        uid: k.params.uid,
        page,
        version,
        gen: [gen; 16],
    }
}

#[test]
fn round_trip_every_suite() {
    for s in Suite::ALL {
        let k = keys(*s);
        let id = id(&k, 3, 9, 1);
        let mut page = [0x5au8; PAGE];
        let tag = k.seal_page(id, &mut page).unwrap();
        // Only `tee-blake3` leaves the page as it is, for the medium's range key.
        assert_eq!(page == [0x5au8; PAGE], *s == Suite::TeeBlake3, "{s:?}");
        k.open_page(id, &mut page, &tag).unwrap();
        assert_eq!(page, [0x5au8; PAGE]);
    }
}

#[test]
fn wrong_key_fails_the_key_check() {
    let p = KeyParams::generate(Suite::XtsBlake3, KdfParams::INSECURE_FAST).unwrap();
    let none = ExternalSuites::new();
    let good = PmoKeys::derive(&UserKey::new(b"a").unwrap(), p, &none).unwrap();
    let bad = PmoKeys::derive(&UserKey::new(b"b").unwrap(), p, &none).unwrap();
    assert_eq!(good.check(&good.key_check_value()), Ok(()));
    assert_eq!(
        bad.check(&good.key_check_value()),
        Err(CryptoError::WrongKey)
    );
    // The key check also depends on the stored KDF parameters.
    let weaker = KeyParams {
        kdf: KdfParams {
            m_kib: 16,
            ..KdfParams::INSECURE_FAST
        },
        ..p
    };
    let other = PmoKeys::derive(&UserKey::new(b"a").unwrap(), weaker, &none).unwrap();
    assert_eq!(
        other.check(&good.key_check_value()),
        Err(CryptoError::WrongKey)
    );
}

#[test]
fn failed_open_leaves_no_plaintext_and_binds_identity() {
    for s in [Suite::XtsBlake3, Suite::AesGcm, Suite::TeeBlake3] {
        let k = keys(s);
        let id = id(&k, 1, 2, 7);
        let mut page = [0x11u8; PAGE];
        let tag = k.seal_page(id, &mut page).unwrap();
        for other in [
            PageId { page: 2, ..id },
            PageId { version: 1, ..id },
            PageId {
                uid: id.uid ^ 1,
                ..id
            },
            PageId { gen: [8; 16], ..id },
        ] {
            let mut p2 = page;
            assert_eq!(k.open_page(other, &mut p2, &tag), Err(CryptoError::BadTag));
            assert_eq!(p2, [0u8; PAGE]);
        }
        let mut p3 = page;
        p3[100] ^= 1;
        assert_eq!(k.open_page(id, &mut p3, &tag), Err(CryptoError::BadTag));
        assert!(!p3.contains(&0x11));
        // A tag of another PMO (another key) does not open it either.
        let mut p4 = page;
        let other = keys_with(s, b"another key");
        assert_eq!(other.open_page(id, &mut p4, &tag), Err(CryptoError::BadTag));
    }
}

/// The generation picks the key: the same (page, version) sealed by two sessions (as after
/// a rollback of the record's epoch counter) never shares a keystream or an XTS block.
#[test]
fn same_page_and_version_in_two_generations_share_no_keystream() {
    for s in [Suite::XtsBlake3, Suite::AesGcm] {
        let k = keys(s);
        let a = [0x42u8; PAGE];
        let mut b = a;
        b[0] = 0x43; // one block differs, 255 equal
        let mut ca = a;
        let mut cb = b;
        k.seal_page(id(&k, 5, 9, 1), &mut ca).unwrap();
        k.seal_page(id(&k, 5, 9, 2), &mut cb).unwrap();
        let same_blocks = ca
            .chunks(16)
            .zip(cb.chunks(16))
            .filter(|(x, y)| x == y)
            .count();
        assert_eq!(same_blocks, 0, "{s:?}: equal ciphertext blocks");
        let xor_ct: Vec<u8> = ca.iter().zip(&cb).map(|(x, y)| x ^ y).collect();
        let xor_pt: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x ^ y).collect();
        assert_ne!(xor_ct, xor_pt, "{s:?}: keystream reuse");
    }
}

#[test]
fn record_mac_binds_bytes_and_key() {
    let k = keys(Suite::XtsBlake3);
    let m = k.record_mac(b"fields");
    assert!(k.check_record_mac(b"fields", &m));
    assert!(!k.check_record_mac(b"fieldz", &m));
    let other = keys_with(Suite::XtsBlake3, b"another key");
    assert!(!other.check_record_mac(b"fields", &m));
}

/// Equal plaintexts on two pages or in two versions never give equal ciphertext blocks (the
/// authors' scheme, kept in the harness's benchmark suites, shows them).
#[test]
fn equal_plaintexts_give_distinct_ciphertexts() {
    let ids = |k: &PmoKeys| [id(k, 0, 1, 1), id(k, 1, 1, 1), id(k, 0, 2, 1)];
    let enc = |k: &PmoKeys, id| {
        let mut p = [0x42u8; PAGE];
        k.seal_page(id, &mut p).unwrap();
        p
    };
    // Both software ciphers (the default `aes-gcm` and `xts-blake3`).
    for ours in [keys(Suite::XtsBlake3), keys(Suite::AesGcm)] {
        let oc: Vec<_> = ids(&ours).into_iter().map(|id| enc(&ours, id)).collect();
        assert_ne!(oc[0], oc[1]);
        assert_ne!(oc[0], oc[2]);
        assert_ne!(oc[1], oc[2]);
        // Not even a single 16-byte block repeats across the three pages.
        let mut blocks = std::collections::HashSet::new();
        for p in &oc {
            for b in p.chunks(16) {
                assert!(blocks.insert(b.to_vec()), "{:?}", ours.params.suite);
            }
        }
    }
}

/// A toy external suite: XOR with its key (the point is what stays in `PmoKeys`: the
/// check before decryption, the wipe, the availability, its own key).
struct Toy;
struct ToyCipher([u8; 32]);

impl ExternalSuite for Toy {
    fn code(&self) -> u8 {
        200
    }
    fn name(&self) -> &'static str {
        "toy"
    }
    fn cipher(
        &self,
        suite_key: &[u8; 32],
        _params: &KeyParams,
        _gen: &KeyGen,
    ) -> Result<Box<dyn ExternalCipher>, CryptoError> {
        Ok(Box::new(ToyCipher(*suite_key)))
    }
}

impl ExternalCipher for ToyCipher {
    fn encrypt(&self, _id: &PageId, data: &mut [u8; PAGE]) -> Result<(), CryptoError> {
        data.iter_mut()
            .zip(self.0.iter().cycle())
            .for_each(|(d, k)| *d ^= k);
        Ok(())
    }
    fn decrypt(&self, id: &PageId, data: &mut [u8; PAGE]) -> Result<(), CryptoError> {
        self.encrypt(id, data)
    }
    fn tag(&self, _id: &PageId, ct: &[u8; PAGE]) -> Tag {
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&blake3::hash(ct).as_bytes()[..TAG_LEN]);
        t
    }
}

#[test]
fn an_external_suite_seals_only_where_registered_and_its_tags_are_checked_here() {
    let toy = ExternalSuites::new().with(Arc::new(Toy)).unwrap();
    let suite = toy.named("toy").unwrap();
    assert_eq!(suite, Suite::External(200));
    assert_eq!(toy.name_of(suite), Some("toy"));
    let p = KeyParams::generate(suite, KdfParams::INSECURE_FAST).unwrap();
    let user = UserKey::new(b"k").unwrap();
    let k = PmoKeys::derive(&user, p, &toy).unwrap();
    assert!(k.suite_available() && k.tags_separable());
    let id = id(&k, 2, 3, 4);
    let mut page = [0x61u8; PAGE];
    let tag = k.seal_page(id, &mut page).unwrap();
    assert_ne!(page, [0x61u8; PAGE]);
    assert_eq!(k.tag_page(id, &page).unwrap(), tag);
    let sealed = page;
    k.open_page(id, &mut page, &tag).unwrap();
    assert_eq!(page, [0x61u8; PAGE]);
    // A bad tag: nothing decrypted, the buffer wiped.
    let mut bad = sealed;
    bad[9] ^= 1;
    assert_eq!(k.open_page(id, &mut bad, &tag), Err(CryptoError::BadTag));
    assert_eq!(bad, [0u8; PAGE]);
    // Its key is its own: not the page cipher's, not the MAC keys.
    let (_, suite_key) = k.external.as_ref().unwrap();
    assert_ne!(suite_key[..], k.cipher_key[..]);
    assert_ne!(suite_key[..], k.mac_key[..]);
    assert_ne!(suite_key[..], k.record_key[..]);
    // Unregistered: the key check and the record MAC still work, pages do not.
    let bare = PmoKeys::derive(&user, p, &ExternalSuites::new()).unwrap();
    assert_eq!(bare.check(&k.key_check_value()), Ok(()));
    assert_eq!(bare.record_mac(b"r"), k.record_mac(b"r"));
    assert!(!bare.suite_available());
    let mut page = sealed;
    assert_eq!(
        bare.open_page(id, &mut page, &tag),
        Err(CryptoError::SuiteUnavailable(200))
    );
    assert_eq!(page, [0u8; PAGE]);
    assert_eq!(
        bare.seal_page(id, &mut [0u8; PAGE]),
        Err(CryptoError::SuiteUnavailable(200))
    );
}

#[test]
fn external_suites_cannot_take_a_built_in_or_a_used_code() {
    struct Code(u8);
    impl ExternalSuite for Code {
        fn code(&self) -> u8 {
            self.0
        }
        fn name(&self) -> &'static str {
            "code"
        }
        fn cipher(
            &self,
            _: &[u8; 32],
            _: &KeyParams,
            _: &KeyGen,
        ) -> Result<Box<dyn ExternalCipher>, CryptoError> {
            Err(CryptoError::Aead)
        }
    }
    for s in Suite::ALL {
        let c = s.code();
        assert_eq!(
            ExternalSuites::new().with(Arc::new(Code(c))).err(),
            Some(CryptoError::SuiteCodeTaken(c))
        );
        assert!(ExternalSuites::new().can_use(*s));
    }
    assert!(ExternalSuites::new().with(Arc::new(Code(0))).is_err());
    let one = ExternalSuites::new().with(Arc::new(Code(9))).unwrap();
    assert!(one.clone().with(Arc::new(Code(9))).is_err());
    assert!(one.can_use(Suite::External(9)));
    assert!(!ExternalSuites::new().can_use(Suite::External(9)));
    assert_eq!(one.name_of(Suite::External(8)), None);
    assert_eq!(format!("{one:?}"), "[(9, \"code\")]");
}

#[test]
fn debug_output_has_no_secrets() {
    let k = keys(Suite::XtsBlake3);
    let s = format!("{k:?} {:?}", UserKey::new(b"secret-key-bytes").unwrap());
    assert!(!s.contains("secret"));
    assert!(!s.contains(&format!("{:?}", &k.mac_key[..4])));
}
