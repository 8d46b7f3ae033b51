//! When a `redis-server` this process started is ready: the one rule of the CLI's demo server,
//! the test kit's launchers, the examples and the soak (the test kit mounts this file; it is
//! here because the published CLI must carry it).
//!
//! A connection to the port proves nothing: a port found free and released can be taken by
//! another process's server before ours binds it, and then ours exits while the other answers
//! in its place. So the server must say who it is: `INFO server` on the port reports the
//! process id we started, and `PING` is answered `PONG` (not `-LOADING`: it serves commands).
//! Standard library only, no `crate::` or `super::` paths.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Whether the server answering on 127.0.0.1:`port` is the process `pid` and serves commands.
/// For a server without a password (`INFO` would be refused).
pub fn served_by(port: u16, pid: u32) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(b"INFO server\r\n").is_err() {
        return false;
    }
    // One bulk reply (`$<len>\r\n<text>\r\n`), or an error line.
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
        let Some(header) = reply.windows(2).position(|w| w == b"\r\n") else {
            continue;
        };
        let len: Option<usize> = std::str::from_utf8(&reply[1..header])
            .ok()
            .and_then(|l| l.parse().ok());
        match (reply[0], len) {
            (b'$', Some(len)) if reply.len() < header + 2 + len => continue,
            _ => break,
        }
    }
    if !String::from_utf8_lossy(&reply).contains(&format!("\r\nprocess_id:{pid}\r\n")) {
        return false;
    }
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut pong = [0u8; 64];
    matches!(stream.read(&mut pong), Ok(n) if pong[..n].starts_with(b"+PONG"))
}
