//! A certificate authority of one test's own, made with the `openssl` command-line tool (rcgen
//! is not in the offline registry), and the server certificates it signs, for TLS tests on
//! loopback: a server started with [`TestCa::issue`]'s certificate is trusted by a client
//! given [`TestCa::cert_path`], and refused by one given another `TestCa`'s.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// A self-signed CA in a temporary folder, removed when dropped.
#[derive(Debug)]
pub struct TestCa {
    dir: tempfile::TempDir,
}

/// A server certificate and its private key, PEM files in the CA's folder.
#[derive(Debug, Clone)]
pub struct ServerCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA named `name` (its subject's common name), valid for a day.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("wh-test-ca-")
            .tempdir()
            .context("creating the CA's folder")?;
        let ca = Self { dir };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &path_arg(&ca.key_path()),
            "-out",
            &path_arg(&ca.cert_path()),
        ])?;
        Ok(ca)
    }

    /// The CA's certificate (PEM): what a client is told to trust.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn key_path(&self) -> PathBuf {
        self.dir.path().join("ca.key")
    }

    /// A server certificate for `localhost` and `127.0.0.1`, signed by this CA, with its key
    /// (files `<file_stem>.pem` and `<file_stem>.key` in the CA's folder, readable by all, so
    /// that a server running as another user can read them).
    pub fn issue(&self, file_stem: &str) -> anyhow::Result<ServerCert> {
        let dir = self.dir.path();
        let key = dir.join(format!("{file_stem}.key"));
        let csr = dir.join(format!("{file_stem}.csr"));
        let cert = dir.join(format!("{file_stem}.pem"));
        let ext = dir.join(format!("{file_stem}.ext"));
        std::fs::write(
            &ext,
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n\
             basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\n",
        )?;
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &path_arg(&key),
            "-out",
            &path_arg(&csr),
        ])?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            &path_arg(&csr),
            "-CA",
            &path_arg(&self.cert_path()),
            "-CAkey",
            &path_arg(&self.key_path()),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &path_arg(&ext),
            "-out",
            &path_arg(&cert),
        ])?;
        // The folder is the tempdir's (0700): servers running as another user (PostgreSQL's
        // `postgres`) get copies of their own; see [`ServerCert::copy_to`].
        Ok(ServerCert { cert, key })
    }
}

impl ServerCert {
    /// Copies the certificate and key into `dir` as `server.pem` and `server.key` (the key
    /// 0600, as PostgreSQL demands) and returns the copies.
    pub fn copy_to(&self, dir: &Path) -> anyhow::Result<ServerCert> {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(dir)?;
        let copy = ServerCert {
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        };
        std::fs::copy(&self.cert, &copy.cert)?;
        std::fs::copy(&self.key, &copy.key)?;
        std::fs::set_permissions(&copy.key, std::fs::Permissions::from_mode(0o600))?;
        Ok(copy)
    }
}

fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

fn openssl(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl (is the openssl package installed?)")?;
    if !output.status.success() {
        bail!(
            "openssl {}: {}: {}",
            args.first().copied().unwrap_or_default(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
