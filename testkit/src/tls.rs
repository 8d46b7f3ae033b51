//! Test certificates made with the `openssl` command line: a CA and a server certificate for
//! `127.0.0.1`, in a temporary directory removed on drop.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory holding `ca.crt`, `ca.key`, `server.crt` and `server.key`.
pub struct TestCerts {
    pub dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (is it installed?)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestCerts {
    /// Makes a fresh CA and a server certificate it signed (P-256 keys, valid one day).
    pub fn new(tag: &str) -> TestCerts {
        let dir = crate::fresh_dir(&format!("redbaton-tls-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec![
            "req", "-x509", "-days", "1", "-keyout", "ca.key", "-out", "ca.crt",
        ];
        ca.extend(ec);
        ca.extend([
            "-subj",
            "/CN=redbaton test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&dir, &ca);
        let mut csr = vec!["req", "-new", "-keyout", "server.key", "-out", "server.csr"];
        csr.extend(ec);
        csr.extend(["-subj", "/CN=127.0.0.1"]);
        openssl(&dir, &csr);
        std::fs::write(
            dir.join("server.ext"),
            "basicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-out",
                "server.crt",
                "-extfile",
                "server.ext",
            ],
        );
        TestCerts { dir }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).to_str().unwrap().to_owned()
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
