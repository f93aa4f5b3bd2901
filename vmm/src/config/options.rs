//! Device option strings: `value[,value][,key=value]...`, one syntax for every device flag
//! (`--pmem`, `--pmo-store`, `--cxl-t3`) and for the same strings in the config file.

use std::collections::BTreeMap;

use super::ConfigError;

/// A parsed device option string `value[,value...][,key=value...]`.
///
/// Each option declares its keys; the first `positional` of them may also
/// be given without `key=`, in order and before any `key=value`. So
/// `--pmem img,1G` and `--pmem path=img,size=1G` mean the same, and a
/// later `--cxl-t3 media=FILE,size=SIZE,ways=2` needs no parser of its own.
/// Values cannot contain commas; a positional value containing `=` must be
/// written as `key=value`.
#[derive(Debug)]
pub struct OptionList<'a> {
    option: &'static str,
    text: &'a str,
    values: BTreeMap<&'static str, &'a str>,
}

impl<'a> OptionList<'a> {
    /// Splits `text`, the value of option `option` (used in messages), into
    /// the declared `keys`.
    pub fn parse(
        option: &'static str,
        text: &'a str,
        keys: &[&'static str],
        positional: usize,
    ) -> Result<Self, ConfigError> {
        let mut list = OptionList {
            option,
            text,
            values: BTreeMap::new(),
        };
        let mut next_positional = 0;
        let mut named_seen = false;
        for item in text.split(',') {
            if item.is_empty() {
                return Err(list.error("empty item".to_string()));
            }
            let (key, value) = match item.split_once('=') {
                Some((key, value)) => {
                    named_seen = true;
                    let Some(key) = keys.iter().copied().find(|k| *k == key) else {
                        return Err(list.error(format!(
                            "unknown key \"{key}\" (expected {})",
                            keys.join(", ")
                        )));
                    };
                    (key, value)
                }
                None if named_seen => {
                    return Err(list.error(format!("\"{item}\" must be written as key=value")));
                }
                None if next_positional < positional.min(keys.len()) => {
                    next_positional += 1;
                    (keys[next_positional - 1], item)
                }
                None => return Err(list.error(format!("unexpected value \"{item}\""))),
            };
            if value.is_empty() {
                return Err(list.error(format!("empty value for {key}")));
            }
            if list.values.insert(key, value).is_some() {
                return Err(list.error(format!("{key} given twice")));
            }
        }
        Ok(list)
    }

    /// The value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.values.get(key).copied()
    }

    /// The value of `key`, which the option cannot do without.
    pub fn required(&self, key: &str) -> Result<&'a str, ConfigError> {
        self.get(key)
            .ok_or_else(|| self.error(format!("missing {key}")))
    }

    /// The value of `key` as a size ([`sizes::parse_size`]).
    pub fn size(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        self.get(key)
            .map(|v| sizes::parse_size(v).map_err(|e| self.error(e.to_string())))
            .transpose()
    }

    /// An error about this option string, for checks done by the caller.
    pub fn error(&self, reason: String) -> ConfigError {
        ConfigError::InvalidOption {
            option: self.option,
            text: self.text.to_string(),
            reason,
        }
    }
}
