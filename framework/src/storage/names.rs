//! How job and operator names become directory names.
//!
//! Names are user input and become path components, so this module decides
//! which names are accepted and how they are spelled on disk. It never
//! touches the file system.
//!
//! # The rule
//!
//! - **Rejected** with [`StoreError::InvalidName`]: the empty name, names
//!   longer than [`MAX_NAME_BYTES`] bytes of UTF-8, and names containing a
//!   control character (NUL, newline, DEL, ...). These are almost certainly
//!   mistakes, and a clear error beats a strange directory.
//! - **Escaped**, everything else: the bytes `a-z`, `0-9`, `_` and `-` are
//!   kept; every other byte (upper-case letters, `.`, `/`, `\`, `%`, spaces,
//!   each byte of a non-ASCII character) becomes `%` and two lower-case hex
//!   digits. So `..` becomes `%2e%2e`, `a/b` becomes `a%2fb` and `Map` becomes
//!   `%4dap`.
//! - The encoded name is prefixed (`job-`, `op-`) so that it is never a name
//!   Windows reserves (`con`, `nul`, ...) and never starts with `.`.
//!
//! Escaping is injective: every output symbol is either one kept character
//! or one `%xx` triple, so [`decode_component`] recovers the name and two
//! different names never share a directory. Because upper-case letters are
//! escaped and hex digits are lower-case, this still holds on
//! case-insensitive file systems. The longest encoding is `3 *
//! MAX_NAME_BYTES + 4` = 244 bytes, within the 255-byte limit of common file
//! systems.

use super::StoreError;

/// The longest accepted name, in bytes of UTF-8. Chosen so that the escaped
/// form plus its prefix fits in a 255-byte file name.
pub const MAX_NAME_BYTES: usize = 80;

/// Checks a job or operator name; `kind` names it in the error.
pub fn validate(kind: &'static str, name: &str) -> Result<(), StoreError> {
    let reject = |reason: String| StoreError::InvalidName {
        kind,
        name: name.chars().take(MAX_NAME_BYTES).collect(),
        reason,
    };
    if name.is_empty() {
        return Err(reject("the name is empty".to_string()));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(reject(format!(
            "the name is {} bytes long; the limit is {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    if let Some(control) = name.chars().find(|c| c.is_control()) {
        return Err(reject(format!(
            "the name contains the control character {:?}",
            control
        )));
    }
    Ok(())
}

/// Escapes a (validated) name into a path component, without prefix.
pub fn encode_component(name: &str) -> String {
    let mut encoded = String::with_capacity(name.len());
    for byte in name.bytes() {
        if is_kept(byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push('%');
            encoded.push(hex_digit(byte >> 4));
            encoded.push(hex_digit(byte & 0x0f));
        }
    }
    encoded
}

/// Reverses [`encode_component`]; `None` if `component` is not an encoding
/// of any name.
pub fn decode_component(component: &str) -> Option<String> {
    let bytes = component.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if is_kept(byte) {
            decoded.push(byte);
            index += 1;
        } else if byte == b'%' && index + 2 < bytes.len() {
            let high = hex_value(bytes[index + 1])?;
            let low = hex_value(bytes[index + 2])?;
            decoded.push(high << 4 | low);
            index += 3;
        } else {
            return None;
        }
    }
    String::from_utf8(decoded).ok()
}

/// The directory name of a job: `job-` and the escaped name.
pub fn job_dir_name(job: &str) -> Result<String, StoreError> {
    validate("job", job)?;
    Ok(format!("job-{}", encode_component(job)))
}

/// The directory name of an operator inside a checkpoint: `op-` and the
/// escaped name.
pub fn operator_dir_name(operator: &str) -> Result<String, StoreError> {
    validate("operator", operator)?;
    Ok(format!("op-{}", encode_component(operator)))
}

fn is_kept(byte: u8) -> bool {
    byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_' || byte == b'-'
}

fn hex_digit(nibble: u8) -> char {
    char::from(b"0123456789abcdef"[usize::from(nibble)])
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_encodes(name: &str, expected: &str) {
        assert_eq!(encode_component(name), expected, "encoding {name:?}");
        assert_eq!(decode_component(expected).as_deref(), Some(name));
    }

    #[test]
    fn plain_names_are_kept() {
        check_encodes("count-by_key2", "count-by_key2");
    }

    #[test]
    fn dots_and_slashes_are_escaped() {
        check_encodes("..", "%2e%2e");
        check_encodes("a/b\\c", "a%2fb%5cc");
    }

    #[test]
    fn upper_case_and_percent_are_escaped() {
        check_encodes("Map%", "%4dap%25");
    }

    #[test]
    fn non_ascii_is_escaped_per_byte() {
        check_encodes("快照", "%e5%bf%ab%e7%85%a7");
    }

    #[test]
    fn malformed_encodings_do_not_decode() {
        for bad in ["%", "%2", "%zz", "%2E", "A", ".", "%ff"] {
            assert_eq!(decode_component(bad), None, "{bad:?}");
        }
    }
}
