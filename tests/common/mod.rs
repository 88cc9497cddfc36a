//! Helpers shared by the live tests (proxy_live, proxy_redis): the venv's
//! binaries, child processes killed on drop, free loopback ports.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Child;

pub fn venv_bin(name: &str) -> PathBuf {
    let venv = std::env::var_os("QSIM_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/qsim-venv")
        });
    let p = venv.join("bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/live-deps.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A child process killed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
