//! The text of `/proc/self/mountinfo`, which the memory cgroup lookup
//! and the volume probe both read (`proc(5)`).

/// A `/proc/self/mountinfo` field with its octal escapes (`\040` for a
/// space) undone, as the kernel writes them (`proc(5)`).
pub fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], digits) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |n, b| n.wrapping_mul(8) + (b - b'0')));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_escapes_are_undone_and_a_short_one_is_kept() {
        assert_eq!(unescape_octal("/mnt/a\\040b\\011c"), "/mnt/a b\tc");
        assert_eq!(unescape_octal("trailing\\04"), "trailing\\04");
        assert_eq!(unescape_octal("/dev/zram0"), "/dev/zram0");
    }
}
