//! RESP, the Redis protocol, for the tests that check a Redis server
//! through its own wire protocol.

use std::io::BufRead;

#[derive(Debug, PartialEq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// One command in RESP: an array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        v.extend_from_slice(a);
        v.extend_from_slice(b"\r\n");
    }
    v
}

pub fn read_reply(r: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if !line.ends_with(b"\r\n") {
        return Err(std::io::Error::other(format!(
            "bad reply line {:?}",
            String::from_utf8_lossy(&line)
        )));
    }
    let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
    let num = || {
        text.parse::<i64>()
            .map_err(|_| std::io::Error::other(format!("bad number {text:?}")))
    };
    Ok(match line[0] {
        b'+' => Reply::Status(text.clone()),
        b'-' => Reply::Error(text.clone()),
        b':' => Reply::Int(num()?),
        b'$' => match usize::try_from(num()?) {
            Err(_) => Reply::Bulk(None),
            Ok(n) => {
                let mut b = vec![0; n + 2];
                r.read_exact(&mut b)?;
                b.truncate(n);
                Reply::Bulk(Some(b))
            }
        },
        b'*' => match usize::try_from(num()?) {
            Err(_) => Reply::Array(None),
            Ok(n) => Reply::Array(Some(
                (0..n)
                    .map(|_| read_reply(r))
                    .collect::<std::io::Result<_>>()?,
            )),
        },
        c => {
            return Err(std::io::Error::other(format!(
                "bad reply type {:?}",
                char::from(c)
            )))
        }
    })
}
