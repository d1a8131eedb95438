//! Who is at the other end of a VM's chardev socket.
//!
//! `SO_PEERCRED` gives the process that called `listen()`. With plain QEMU that is QEMU. libvirt
//! instead opens the listening socket itself and passes its fd to QEMU, so `SO_PEERCRED` names
//! libvirt's daemon. Then we ask the kernel (`sock_diag`, `UNIX_DIAG_PEER`) for the inode of the
//! socket at the other end of our connection -- the one QEMU got from `accept()` -- and find the
//! process that holds it in `/proc/*/fd`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const UDIAG_SHOW_PEER: u32 = 0x04;
const UNIX_DIAG_PEER: u16 = 2;
const NLMSG_ERROR: u16 = 2;

/// Inode number of a socket fd (as in `socket:[inode]`).
pub fn socket_inode(fd: RawFd) -> io::Result<u64> {
    // SAFETY: fstat writes into a zeroed stat struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `fd` is a descriptor the caller owns.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_ino)
}

/// Inode of the socket at the other end of our connected unix socket `fd`.
pub fn unix_peer_inode(fd: RawFd) -> io::Result<u64> {
    let ino = socket_inode(fd)?;
    // SAFETY: creating a socket; the fd is owned by the OwnedFd right away.
    let nl = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG) };
    if nl < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `nl` is a fresh descriptor nobody else owns.
    let nl = unsafe { OwnedFd::from_raw_fd(nl) };

    // struct nlmsghdr (16) + struct unix_diag_req (24)
    let mut req = Vec::with_capacity(40);
    req.extend_from_slice(&40u32.to_ne_bytes()); // nlmsg_len
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes()); // nlmsg_type
    req.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes()); // nlmsg_flags
    req.extend_from_slice(&1u32.to_ne_bytes()); // nlmsg_seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
    req.push(libc::AF_UNIX as u8); // sdiag_family
    req.push(0); // sdiag_protocol
    req.extend_from_slice(&0u16.to_ne_bytes()); // pad
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // udiag_states: all
    req.extend_from_slice(&(ino as u32).to_ne_bytes()); // udiag_ino
    req.extend_from_slice(&UDIAG_SHOW_PEER.to_ne_bytes()); // udiag_show
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // udiag_cookie: none
    req.extend_from_slice(&u32::MAX.to_ne_bytes());
    // SAFETY: sending a buffer we own, of its length.
    if unsafe { libc::send(nl.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 8192];
    // SAFETY: receiving into a buffer we own, of its length.
    let n = unsafe { libc::recv(nl.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    parse_peer_reply(&buf[..n as usize])
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// Parses the reply: `nlmsghdr`, `unix_diag_msg` (16 bytes), then attributes.
fn parse_peer_reply(b: &[u8]) -> io::Result<u64> {
    let bad = || io::Error::other("malformed sock_diag reply");
    let len = u32_at(b, 0).ok_or_else(bad)? as usize;
    let kind = u16_at(b, 4).ok_or_else(bad)?;
    if kind == NLMSG_ERROR {
        let errno = u32_at(b, 16).ok_or_else(bad)? as i32;
        return Err(io::Error::from_raw_os_error(-errno));
    }
    let end = len.min(b.len());
    let mut off = 16 + 16;
    while off + 4 <= end {
        let rta_len = u16_at(b, off).ok_or_else(bad)? as usize;
        let rta_type = u16_at(b, off + 2).ok_or_else(bad)?;
        if rta_len < 4 {
            break;
        }
        if rta_type == UNIX_DIAG_PEER {
            return Ok(u32_at(b, off + 4).ok_or_else(bad)? as u64);
        }
        off += (rta_len + 3) & !3;
    }
    Err(io::Error::new(io::ErrorKind::NotFound, "the socket has no peer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn finds_the_accepted_socket_of_a_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let l = UnixListener::bind(&path).unwrap();
        let c = UnixStream::connect(&path).unwrap();
        let (accepted, _) = l.accept().unwrap();
        let peer = unix_peer_inode(c.as_raw_fd()).unwrap();
        assert_eq!(peer, socket_inode(accepted.as_raw_fd()).unwrap());
        assert_ne!(peer, socket_inode(c.as_raw_fd()).unwrap());
    }

    #[test]
    fn error_replies_are_errors() {
        let mut b = vec![0u8; 36];
        b[0..4].copy_from_slice(&36u32.to_ne_bytes());
        b[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        b[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(parse_peer_reply(&b).unwrap_err().raw_os_error(), Some(libc::ENOENT));
        assert!(parse_peer_reply(&[1, 2]).is_err());
    }
}
