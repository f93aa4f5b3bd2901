//! From a user key to a PMO's root key: Argon2id, memory-hard.
//!
//! A copied store file holds each PMO's salt and key-check value, so an attacker can test key
//! guesses offline. With a fast hash they could test billions per second; Argon2id makes every
//! guess cost the memory and passes stored in the record (64 MiB and 3 passes by default, about
//! 0.2 s on this project's machines). The store runs it once per attach (and per create,
//! destroy and keyed verify), never per page.
//!
//! The parameters are read from the medium before anything can be verified (the keys that
//! verify the record come out of this function), so they are hostile input: [`KdfParams::check`]
//! bounds them, which bounds the memory and time an edited record can make an attach spend.
//! Lowering them gains an attacker nothing: the derived key changes, and the key check fails.

use super::{CryptoError, UserKey};
use zeroize::Zeroizing;

/// Argon2id cost parameters of one PMO, stored in its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KdfParams {
    /// Memory in KiB.
    pub m_kib: u32,
    /// Passes over the memory.
    pub t: u32,
    /// Lanes.
    pub p: u32,
}

impl KdfParams {
    /// What a PMO gets unless its creator asks otherwise: 64 MiB, 3 passes, 1 lane.
    pub const DEFAULT: KdfParams = KdfParams {
        m_kib: 64 * 1024,
        t: 3,
        p: 1,
    };
    /// The cheapest parameters Argon2id accepts (8 KiB, 1 pass). For tests and benchmarks,
    /// which attach thousands of times; they give no protection against offline guessing.
    pub const INSECURE_FAST: KdfParams = KdfParams {
        m_kib: 8,
        t: 1,
        p: 1,
    };
    /// Most memory a record may ask for: 1 GiB.
    pub const MAX_M_KIB: u32 = 1 << 20;
    /// Most passes a record may ask for.
    pub const MAX_T: u32 = 16;
    /// Most lanes a record may ask for.
    pub const MAX_P: u32 = 8;
    /// Most work a record may ask for, memory times passes in KiB: 4 GiB-passes, about 20 times
    /// the default, a few seconds here. An edited record can make an attach spend at most this.
    pub const MAX_WORK_KIB: u64 = 4 << 20;

    /// Checks the bounds; values outside them (from a damaged or edited record, or a bad
    /// option) are refused before any memory is allocated.
    pub fn check(&self) -> Result<(), CryptoError> {
        let ok = (1..=Self::MAX_P).contains(&self.p)
            && (1..=Self::MAX_T).contains(&self.t)
            && self.m_kib <= Self::MAX_M_KIB
            && u64::from(self.m_kib) >= 8 * u64::from(self.p)
            && u64::from(self.m_kib) * u64::from(self.t) <= Self::MAX_WORK_KIB;
        if ok {
            Ok(())
        } else {
            Err(CryptoError::KdfParams(*self))
        }
    }

    /// Parses `m=64M,t=3,p=1` (every part optional, the rest from [`KdfParams::DEFAULT`]);
    /// memory is a size in the workspace's one grammar (`sizes`), a whole number of KiB.
    /// `fast` is [`KdfParams::INSECURE_FAST`].
    pub fn parse(s: &str) -> Result<KdfParams, CryptoError> {
        let bad = || CryptoError::KdfSpec(s.chars().take(80).collect());
        if s == "fast" {
            return Ok(Self::INSECURE_FAST);
        }
        let mut k = Self::DEFAULT;
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (name, value) = part.split_once('=').ok_or_else(bad)?;
            match name {
                "m" => {
                    let bytes = sizes::parse_size(value).map_err(|_| bad())?;
                    if !bytes.is_multiple_of(1024) {
                        return Err(bad());
                    }
                    k.m_kib = u32::try_from(bytes / 1024).map_err(|_| bad())?;
                }
                "t" => k.t = value.parse().map_err(|_| bad())?,
                "p" => k.p = value.parse().map_err(|_| bad())?,
                _ => return Err(bad()),
            }
        }
        k.check()?;
        Ok(k)
    }
}

impl Default for KdfParams {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The cost in the grammar [`KdfParams::parse`] reads (`m=65536K,t=3,p=1`, or `fast`), so a
/// configuration that stores it as text reads it back the same.
impl std::fmt::Display for KdfParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == Self::INSECURE_FAST {
            return f.write_str("fast");
        }
        write!(f, "m={}K,t={},p={}", self.m_kib, self.t, self.p)
    }
}

impl std::str::FromStr for KdfParams {
    type Err = CryptoError;

    fn from_str(s: &str) -> Result<Self, CryptoError> {
        Self::parse(s)
    }
}

/// Runs Argon2id over the user key with the PMO's salt: the PMO's 32-byte root key, from which
/// every other key of the PMO is expanded.
pub fn root_key(
    user: &UserKey,
    salt: &[u8; 32],
    params: KdfParams,
) -> Result<Zeroizing<[u8; 32]>, CryptoError> {
    params.check()?;
    let p = argon2::Params::new(params.m_kib, params.t, params.p, Some(32))
        .map_err(|_| CryptoError::KdfParams(params))?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, p);
    let mut out = Zeroizing::new([0u8; 32]);
    a.hash_password_into(user.bytes(), salt, &mut out[..])
        .map_err(|_| CryptoError::KdfParams(params))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_bounds() {
        assert_eq!(KdfParams::parse("").unwrap(), KdfParams::DEFAULT);
        assert_eq!(
            KdfParams::parse("m=8M,t=2").unwrap(),
            KdfParams {
                m_kib: 8192,
                t: 2,
                p: 1
            }
        );
        assert_eq!(KdfParams::parse("fast").unwrap(), KdfParams::INSECURE_FAST);
        assert_eq!(KdfParams::parse("m=1G,t=1").unwrap().m_kib, 1 << 20);
        assert_eq!(KdfParams::parse("m=65536KiB").unwrap().m_kib, 65536);
        assert_eq!(KdfParams::parse("m=256M,t=16").unwrap().t, 16);
        for k in [
            KdfParams::DEFAULT,
            KdfParams::INSECURE_FAST,
            KdfParams::parse("m=8M,t=2,p=2").unwrap(),
        ] {
            assert_eq!(k.to_string().parse::<KdfParams>(), Ok(k), "{k}");
        }
        for bad in [
            "m=1G,t=5",
            "m=512M,t=16",
            "m=2G",
            "t=0",
            "t=17",
            "p=0",
            "p=9",
            "m=4,p=1",
            "m=4097",
            "m=1025",
            "m=x",
            "q=1",
            "m",
            "m=99999999999G",
        ] {
            assert!(KdfParams::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn root_key_depends_on_key_salt_and_every_parameter() {
        let k = UserKey::new(b"pw").unwrap();
        let f = KdfParams::INSECURE_FAST;
        let a = root_key(&k, &[1; 32], f).unwrap();
        assert_eq!(a, root_key(&k, &[1; 32], f).unwrap());
        assert_ne!(a, root_key(&k, &[2; 32], f).unwrap());
        assert_ne!(
            a,
            root_key(&UserKey::new(b"pW").unwrap(), &[1; 32], f).unwrap()
        );
        assert_ne!(a, root_key(&k, &[1; 32], KdfParams { t: 2, ..f }).unwrap());
        assert_ne!(
            a,
            root_key(&k, &[1; 32], KdfParams { m_kib: 16, ..f }).unwrap()
        );
        let out_of_bounds = KdfParams { t: 1000, ..f };
        assert_eq!(
            root_key(&k, &[1; 32], out_of_bounds).err(),
            Some(CryptoError::KdfParams(out_of_bounds))
        );
    }
}
