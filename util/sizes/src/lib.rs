//! Sizes as people write them on pmovmm's command lines, in its config files and to its host
//! tools: one grammar everywhere, so `--memory 1G`, `--pmo-store F,64M`, `store create --size
//! 64MiB` and `--pmo-kdf m=64M` mean what they say in the same way.
//!
//! A size is decimal digits with an optional binary unit: `K`, `M`, `G` or `T` (either case),
//! optionally spelled `KiB`, `MiB`, `GiB`, `TiB`. `4096`, `64M`, `64MiB` and `1g` are sizes;
//! `64MB` (decimal or binary?), `1.5G`, `-1` and `0x1000` are not.

use std::fmt;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Why a size did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Not digits with an optional K/M/G/T unit.
    #[error("invalid size \"{0}\" (bytes, or a number with K, M, G or T)")]
    Invalid(String),
    /// More than 2^64 - 1 bytes.
    #[error("size \"{0}\" is too large")]
    Overflow(String),
}

/// Parses a size in the grammar above.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let invalid = || SizeError::Invalid(text.chars().take(64).collect());
    let number = text
        .strip_suffix("iB")
        .filter(|n| n.ends_with(|c: char| "kKmMgGtT".contains(c)))
        .unwrap_or(text);
    let (digits, unit) = match number.as_bytes().last() {
        Some(b'k' | b'K') => (&number[..number.len() - 1], KIB),
        Some(b'm' | b'M') => (&number[..number.len() - 1], MIB),
        Some(b'g' | b'G') => (&number[..number.len() - 1], GIB),
        Some(b't' | b'T') => (&number[..number.len() - 1], TIB),
        _ => (number, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let overflow = || SizeError::Overflow(text.chars().take(64).collect());
    let n: u64 = digits.parse().map_err(|_| overflow())?;
    n.checked_mul(unit).ok_or_else(overflow)
}

/// A byte count shown the way sizes are written (`2G`, `3M`, `4097`), so messages echo the
/// user's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match n {
            0 => write!(f, "0"),
            _ if n.is_multiple_of(TIB) => write!(f, "{}T", n / TIB),
            _ if n.is_multiple_of(GIB) => write!(f, "{}G", n / GIB),
            _ if n.is_multiple_of(MIB) => write!(f, "{}M", n / MIB),
            _ if n.is_multiple_of(KIB) => write!(f, "{}K", n / KIB),
            _ => write!(f, "{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_every_spelling() {
        for (text, n) in [
            ("0", 0),
            ("4096", 4096),
            ("4k", 4 << 10),
            ("64M", 64 << 20),
            ("64MiB", 64 << 20),
            ("1g", 1 << 30),
            ("1GiB", 1 << 30),
            ("2T", 2 << 40),
            ("2TiB", 2 << 40),
            ("16777215T", 16_777_215 << 40),
        ] {
            assert_eq!(parse_size(text), Ok(n), "{text}");
        }
    }

    #[test]
    fn not_sizes() {
        for text in [
            "", "M", "MiB", "iB", "64MB", "64B", "64 M", " 64", "1.5G", "-1", "+1", "0x10",
            "64m iB", "64Mib", "12iB", "1P",
        ] {
            assert!(
                matches!(parse_size(text), Err(SizeError::Invalid(_))),
                "{text}"
            );
        }
        for text in [
            "16777216T",
            "18446744073709551616",
            "99999999999999999999999K",
        ] {
            assert!(
                matches!(parse_size(text), Err(SizeError::Overflow(_))),
                "{text}"
            );
        }
    }

    #[test]
    fn displayed_in_the_largest_exact_unit() {
        assert_eq!(ByteSize(0).to_string(), "0");
        assert_eq!(ByteSize(4097).to_string(), "4097");
        assert_eq!(ByteSize(3 << 20).to_string(), "3M");
        assert_eq!(ByteSize(1 << 40).to_string(), "1T");
        assert_eq!(ByteSize((1 << 30) + (1 << 10)).to_string(), "1048577K");
    }
}
