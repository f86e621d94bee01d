//! Quoting argv for a remote shell (`agent-run remote` and `agent-run-mcp` send commands over ssh).
//!
//! ssh sends its remote command as ONE string, which the remote user's login shell parses
//! (`$SHELL -c STRING`). To get an argv across unchanged, every word is single-quoted here, on
//! bytes: inside single quotes a POSIX shell gives every byte its literal value (spaces, `$`,
//! backquotes, backslashes, newlines, non-UTF-8 bytes), except `'` itself, which is written as
//! `'\''` (close the quote, an escaped quote, reopen). The empty word becomes `''`.
//!
//! What this does not do: argv cannot hold NUL bytes, so a word with one is refused. A login
//! shell that is not POSIX (fish, csh) parses the string differently; agent-run requires sh,
//! bash, dash, ksh or zsh on the remote account.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// One word, single-quoted for a POSIX shell.
pub fn quote(word: &OsStr) -> Vec<u8> {
    let bytes = word.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() + 2);
    out.push(b'\'');
    for &b in bytes {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

/// Words as one shell command: each quoted, separated by spaces. `None` if a word holds a NUL
/// byte (no argv can carry it).
pub fn command(words: &[OsString]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if w.as_bytes().contains(&0) {
            return None;
        }
        if i > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(&quote(w));
    }
    Some(out)
}

/// Bytes as an `OsString` (for `Command::arg`).
pub fn os(bytes: Vec<u8>) -> OsString {
    OsString::from_vec(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Run `SHELL -c 'printf "%s\0" <quoted words>'` and split its output on NUL: the argv a
    /// shell built from our string. `sh` always; `bash` (a common login shell) when installed.
    fn through_sh(words: &[OsString]) -> Vec<Vec<u8>> {
        let mut script = b"printf '%s\\0' ".to_vec();
        script.extend_from_slice(&command(words).expect("no NUL"));
        let mut answers = Vec::new();
        for shell in ["sh", "bash"] {
            let out = match Command::new(shell)
                .arg("-c")
                .arg(os(script.clone()))
                .output()
            {
                Ok(out) => out,
                Err(_) if shell != "sh" => continue,
                Err(e) => panic!("cannot run sh: {e}"),
            };
            assert!(out.status.success(), "{shell} failed: {out:?}");
            let mut got: Vec<Vec<u8>> = out.stdout.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
            assert_eq!(got.pop(), Some(Vec::new()), "output ends with NUL");
            answers.push(got);
        }
        answers.dedup();
        assert_eq!(answers.len(), 1, "the shells disagree: {answers:?}");
        answers.pop().unwrap()
    }

    fn hostile() -> Vec<OsString> {
        let words: Vec<&[u8]> = vec![
            b"plain",
            b"two words",
            b"",
            b"'",
            b"''",
            b"it's",
            b"\"double\"",
            b"$HOME",
            b"${PATH}",
            b"`id`",
            b"$(echo pwned)",
            b"back\\slash\\",
            b"new\nline\n",
            b"tab\there",
            b"-n",
            b"--",
            b"-e",
            b"*",
            b"?[a]",
            b"~",
            b"a;b|c&d>e<f",
            b"!bang",
            b"#hash",
            b"\xff\xfe\x80 not utf-8",
            b"\x01\x7f controls \x1b[31m",
            b"caf\xc3\xa9",
        ];
        words.into_iter().map(|w| os(w.to_vec())).collect()
    }

    #[test]
    fn every_hostile_word_survives_a_posix_shell_byte_for_byte() {
        let words = hostile();
        let got = through_sh(&words);
        let want: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn each_word_alone_survives_too() {
        for w in hostile() {
            assert_eq!(
                through_sh(std::slice::from_ref(&w)),
                vec![w.as_bytes().to_vec()]
            );
        }
    }

    #[test]
    fn quotes_are_closed_escaped_and_reopened() {
        assert_eq!(quote(OsStr::new("it's")), b"'it'\\''s'");
        assert_eq!(quote(OsStr::new("")), b"''");
        assert_eq!(
            command(&[os(b"a b".to_vec()), os(b"c".to_vec())]).unwrap(),
            b"'a b' 'c'"
        );
    }

    #[test]
    fn a_nul_byte_is_refused() {
        assert_eq!(command(&[os(b"a\0b".to_vec())]), None);
    }
}
