//! [`SignInGate`]: a relay's sign-in in front of a real SMTP server that has none (the shared
//! sink), for faults of the login alone. It offers `AUTH PLAIN LOGIN` in its EHLO answer,
//! takes any credentials or refuses them all (`535 5.7.8`) as switched, and once signed in
//! passes every byte both ways to the server, whose own greeting and EHLO answer it relays.
//! Switched to refusing, it also ends the sessions signed in before, as a provider does when a
//! password is changed or a token revoked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the gate answers to AUTH while it refuses.
pub const REFUSAL: &str = "535 5.7.8 Authentication credentials invalid";

/// A sign-in in front of an SMTP server without one (see the module docs). Dropping it closes
/// its port.
#[derive(Debug)]
pub struct SignInGate {
    addr: SocketAddr,
    refusing: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    /// Goes up each time the gate starts refusing: the signed-in sessions end.
    ends: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl SignInGate {
    /// Starts a gate to `upstream` on `127.0.0.1`, on a free port, taking every sign-in.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the sign-in gate")?;
        let addr = listener.local_addr()?;
        let refusing = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicU64::new(0));
        let ends = watch::channel(0).0;
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            (refusing.clone(), refused.clone()),
            ends.subscribe(),
        ));
        Ok(Self {
            addr,
            refusing,
            refused,
            ends,
            accept,
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// From now on every AUTH is answered [`REFUSAL`], and the sessions signed in before end.
    pub fn refuse(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        self.ends.send_modify(|n| *n += 1);
    }

    /// From now on every AUTH is taken.
    pub fn accept(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }

    /// How many sign-ins it refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

impl Drop for SignInGate {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    (refusing, refused): (Arc<AtomicBool>, Arc<AtomicU64>),
    ends: watch::Receiver<u64>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let (refusing, refused) = (refusing.clone(), refused.clone());
        let mut ends = ends.clone();
        ends.mark_unchanged();
        tokio::spawn(async move {
            // A session ends when either side closes, or when the gate starts refusing; how
            // it ended is no test's concern.
            tokio::select! {
                _ = session(client, upstream, &refusing, &refused) => {}
                _ = ends.changed() => {}
            }
        });
    }
}

/// One client: greeting and EHLO relayed (AUTH added), AUTH answered here, then a pipe.
async fn session(
    client: TcpStream,
    upstream: SocketAddr,
    refusing: &AtomicBool,
    refused: &AtomicU64,
) -> anyhow::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    let (server_read, mut server_write) = server.into_split();
    let (client_read, mut client_write) = client.into_split();
    let mut server_read = BufReader::new(server_read);
    let mut client_read = BufReader::new(client_read);
    let greeting = reply(&mut server_read).await?;
    client_write.write_all(greeting.as_bytes()).await?;
    loop {
        let mut line = String::new();
        if client_read.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let verb = line
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        match verb.as_str() {
            "EHLO" => {
                server_write.write_all(line.as_bytes()).await?;
                let answer = reply(&mut server_read).await?;
                client_write
                    .write_all(with_auth(&answer).as_bytes())
                    .await?;
            }
            "AUTH" if refusing.load(Ordering::SeqCst) => {
                refused.fetch_add(1, Ordering::SeqCst);
                client_write
                    .write_all(format!("{REFUSAL}\r\n").as_bytes())
                    .await?;
            }
            "AUTH" => {
                client_write
                    .write_all(b"235 2.7.0 Authentication successful\r\n")
                    .await?;
                break;
            }
            _ => {
                server_write.write_all(line.as_bytes()).await?;
                let answer = reply(&mut server_read).await?;
                client_write.write_all(answer.as_bytes()).await?;
                if verb == "QUIT" {
                    return Ok(());
                }
            }
        }
    }
    let to_server = tokio::io::copy(&mut client_read, &mut server_write);
    let to_client = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        _ = to_server => {}
        _ = to_client => {}
    }
    Ok(())
}

/// One whole reply, every line of a multi-line one.
async fn reply(read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> anyhow::Result<String> {
    let mut whole = String::new();
    loop {
        let mut line = String::new();
        anyhow::ensure!(read.read_line(&mut line).await? > 0, "the server closed");
        let last = line.as_bytes().get(3) != Some(&b'-');
        whole.push_str(&line);
        if last {
            return Ok(whole);
        }
    }
}

/// The EHLO answer with `AUTH PLAIN LOGIN` among its lines.
fn with_auth(answer: &str) -> String {
    let mut lines: Vec<&str> = answer.lines().collect();
    let Some(last) = lines.pop() else {
        return answer.to_string();
    };
    let code = last.get(..3).unwrap_or("250");
    let mut out = String::new();
    for line in lines {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!("{code}-{}\r\n", last.get(4..).unwrap_or("")));
    out.push_str(&format!("{code} AUTH PLAIN LOGIN\r\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_is_offered_on_the_last_line_of_the_ehlo_answer() {
        let answer = "250-sink Hello\r\n250 8BITMIME\r\n";
        assert_eq!(
            with_auth(answer),
            "250-sink Hello\r\n250-8BITMIME\r\n250 AUTH PLAIN LOGIN\r\n"
        );
        assert_eq!(
            with_auth("250 sink\r\n"),
            "250-sink\r\n250 AUTH PLAIN LOGIN\r\n"
        );
    }
}
