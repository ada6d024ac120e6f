//! Sockets: unix, inet (TCP/UDP, IPv4/IPv6), netlink and packet, with addresses,
//! states and queue sizes.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::dir::ImageDir;
use crate::error::Result;
use crate::proto::{FileEntry, InetSkEntry, NetlinkSkEntry, PacketSockEntry, UnixSkEntry};

/// The address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketFamily {
    Unix,
    Inet,
    Inet6,
    Netlink,
    Packet,
    Other(u32),
}

impl SocketFamily {
    pub fn from_raw(raw: u32) -> SocketFamily {
        match raw {
            1 => SocketFamily::Unix,
            2 => SocketFamily::Inet,
            10 => SocketFamily::Inet6,
            16 => SocketFamily::Netlink,
            17 => SocketFamily::Packet,
            other => SocketFamily::Other(other),
        }
    }

    /// "unix", "inet", "inet6", "netlink", "packet" or "family-N".
    pub fn name(&self) -> String {
        match self {
            SocketFamily::Unix => "unix".into(),
            SocketFamily::Inet => "inet".into(),
            SocketFamily::Inet6 => "inet6".into(),
            SocketFamily::Netlink => "netlink".into(),
            SocketFamily::Packet => "packet".into(),
            SocketFamily::Other(n) => format!("family-{n}"),
        }
    }
}

/// One socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Socket {
    pub family: SocketFamily,
    /// "tcp", "udp", "udplite", "icmp", "raw", "unix", a netlink protocol ("route",
    /// "generic", ...) or "packet".
    pub protocol: String,
    /// "stream", "dgram", "seqpacket", "raw", "packet", ...
    pub kind: String,
    /// "LISTEN", "ESTABLISHED", "CLOSE", ... (the kernel's TCP state names, which unix
    /// sockets use too); None for netlink and packet sockets.
    pub state: Option<String>,
    pub inode: u32,
    /// Local address: an IP address, a unix path ("@name" for an abstract name), a
    /// netlink port id or an interface index.
    pub local: Option<String>,
    pub local_port: Option<u16>,
    pub remote: Option<String>,
    pub remote_port: Option<u16>,
    /// The inode of the peer (unix sockets).
    pub peer_inode: Option<u32>,
    pub backlog: Option<u32>,
    /// SO_SNDBUF and SO_RCVBUF.
    pub send_buf: u32,
    pub recv_buf: u32,
    /// Bytes dumped from the receive and send queues (TCP: tcp-stream image; others:
    /// sk-queues.img, which holds receive queues only). None when the image records none.
    pub in_queue: Option<u64>,
    pub out_queue: Option<u64>,
}

/// What socket descriptions need beyond files.img.
#[derive(Debug, Default)]
pub struct SocketContext {
    /// sk-queues.img: queued bytes by socket id.
    pub queues: HashMap<u32, u64>,
}

impl SocketContext {
    pub fn load(dir: &ImageDir) -> Result<SocketContext> {
        Ok(SocketContext {
            queues: dir.socket_queues()?,
        })
    }
}

/// The socket behind a file entry, or None if the entry is not a socket.
pub fn describe(dir: &ImageDir, ctx: &SocketContext, file: &FileEntry) -> Result<Option<Socket>> {
    if let Some(sk) = &file.usk {
        return Ok(Some(unix(sk, ctx)));
    }
    if let Some(sk) = &file.isk {
        return inet(dir, sk).map(Some);
    }
    if let Some(sk) = &file.nlsk {
        return Ok(Some(netlink(sk, ctx)));
    }
    if let Some(sk) = &file.psk {
        return Ok(Some(packet(sk, ctx)));
    }
    Ok(None)
}

fn unix(sk: &UnixSkEntry, ctx: &SocketContext) -> Socket {
    Socket {
        family: SocketFamily::Unix,
        protocol: "unix".into(),
        kind: sock_type(sk.r#type),
        state: Some(tcp_state(sk.state)),
        inode: sk.ino,
        local: unix_name(&sk.name, sk.name_dir.as_deref()),
        local_port: None,
        remote: None,
        remote_port: None,
        peer_inode: (sk.peer != 0).then_some(sk.peer),
        backlog: Some(sk.backlog),
        send_buf: sk.opts.so_sndbuf,
        recv_buf: sk.opts.so_rcvbuf,
        in_queue: ctx.queues.get(&sk.id).copied(),
        out_queue: None,
    }
}

fn inet(dir: &ImageDir, sk: &InetSkEntry) -> Result<Socket> {
    let family = SocketFamily::from_raw(sk.family);
    let protocol = match sk.proto {
        6 => "tcp".to_string(),
        17 => "udp".to_string(),
        136 => "udplite".to_string(),
        1 => "icmp".to_string(),
        58 => "icmpv6".to_string(),
        0 if sk.r#type == 3 => "raw".to_string(),
        n => format!("proto-{n}"),
    };
    let (in_queue, out_queue) = if sk.proto == 6 {
        match dir.tcp_stream(sk.ino)? {
            Some(ts) => (Some(u64::from(ts.inq_len)), Some(u64::from(ts.outq_len))),
            None => (None, None),
        }
    } else {
        (None, None)
    };
    let connected = sk.dst_port != 0 || sk.dst_addr.iter().any(|w| *w != 0);
    Ok(Socket {
        family,
        protocol,
        kind: sock_type(sk.r#type),
        state: Some(tcp_state(sk.state)),
        inode: sk.ino,
        local: ip_address(&sk.src_addr),
        local_port: u16::try_from(sk.src_port).ok(),
        remote: if connected {
            ip_address(&sk.dst_addr)
        } else {
            None
        },
        remote_port: if connected {
            u16::try_from(sk.dst_port).ok()
        } else {
            None
        },
        peer_inode: None,
        backlog: Some(sk.backlog),
        send_buf: sk.opts.so_sndbuf,
        recv_buf: sk.opts.so_rcvbuf,
        in_queue,
        out_queue,
    })
}

fn netlink(sk: &NetlinkSkEntry, ctx: &SocketContext) -> Socket {
    let protocol = match sk.protocol {
        0 => "route".to_string(),
        4 => "sock_diag".to_string(),
        9 => "audit".to_string(),
        15 => "kobject_uevent".to_string(),
        16 => "generic".to_string(),
        n => format!("netlink-{n}"),
    };
    Socket {
        family: SocketFamily::Netlink,
        protocol,
        kind: "raw".into(),
        state: None,
        inode: sk.ino,
        local: Some(format!("port {}", sk.portid)),
        local_port: None,
        remote: (sk.dst_portid != 0).then(|| format!("port {}", sk.dst_portid)),
        remote_port: None,
        peer_inode: None,
        backlog: None,
        send_buf: sk.opts.so_sndbuf,
        recv_buf: sk.opts.so_rcvbuf,
        in_queue: ctx.queues.get(&sk.id).copied(),
        out_queue: None,
    }
}

fn packet(sk: &PacketSockEntry, ctx: &SocketContext) -> Socket {
    Socket {
        family: SocketFamily::Packet,
        protocol: "packet".into(),
        kind: sock_type(sk.r#type),
        state: None,
        inode: 0,
        local: Some(format!("ifindex {}", sk.ifindex)),
        local_port: None,
        remote: None,
        remote_port: None,
        peer_inode: None,
        backlog: None,
        send_buf: sk.opts.so_sndbuf,
        recv_buf: sk.opts.so_rcvbuf,
        in_queue: ctx.queues.get(&sk.id).copied(),
        out_queue: None,
    }
}

/// SOCK_* type names.
pub fn sock_type(raw: u32) -> String {
    match raw {
        1 => "stream".into(),
        2 => "dgram".into(),
        3 => "raw".into(),
        4 => "rdm".into(),
        5 => "seqpacket".into(),
        6 => "dccp".into(),
        10 => "packet".into(),
        n => format!("type-{n}"),
    }
}

/// The kernel's TCP state names (include/net/tcp_states.h).
pub fn tcp_state(raw: u32) -> String {
    const NAMES: [&str; 12] = [
        "UNKNOWN",
        "ESTABLISHED",
        "SYN_SENT",
        "SYN_RECV",
        "FIN_WAIT1",
        "FIN_WAIT2",
        "TIME_WAIT",
        "CLOSE",
        "CLOSE_WAIT",
        "LAST_ACK",
        "LISTEN",
        "CLOSING",
    ];
    NAMES
        .get(raw as usize)
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("STATE-{raw}"))
}

/// An address stored as 32-bit words in memory order (one for IPv4, four for IPv6).
pub fn ip_address(words: &[u32]) -> Option<String> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    match bytes.len() {
        4 => Some(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).to_string()),
        16 => {
            let octets: [u8; 16] = bytes.try_into().ok()?;
            Some(Ipv6Addr::from(octets).to_string())
        }
        _ => None,
    }
}

/// A unix socket name: a path, "@name" for an abstract name, None when unnamed.
pub fn unix_name(name: &[u8], dir: Option<&str>) -> Option<String> {
    match name.split_first() {
        None => None,
        Some((0, rest)) => {
            // Like ss(8): every zero byte of an abstract name shows as '@'.
            let rest: Vec<u8> = rest
                .iter()
                .map(|&b| if b == 0 { b'@' } else { b })
                .collect();
            Some(format!("@{}", String::from_utf8_lossy(&rest)))
        }
        Some(_) => {
            let name = String::from_utf8_lossy(name).into_owned();
            match dir {
                Some(d) if !name.starts_with('/') && !d.is_empty() => {
                    Some(format!("{}/{name}", d.trim_end_matches('/')))
                }
                _ => Some(name),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_in_memory_order() {
        assert_eq!(
            ip_address(&[u32::from_le_bytes([127, 0, 0, 1])]).unwrap(),
            "127.0.0.1"
        );
        let mut v6 = [0u32; 4];
        v6[3] = u32::from_le_bytes([0, 0, 0, 1]);
        assert_eq!(ip_address(&v6).unwrap(), "::1");
        assert_eq!(ip_address(&[1, 2]), None);
    }

    #[test]
    fn names_and_states() {
        assert_eq!(unix_name(b"\0abs\0x", None).unwrap(), "@abs@x");
        assert_eq!(unix_name(b"sock", Some("/run/")).unwrap(), "/run/sock");
        assert_eq!(unix_name(b"", None), None);
        assert_eq!(tcp_state(10), "LISTEN");
        assert_eq!(tcp_state(99), "STATE-99");
        assert_eq!(sock_type(5), "seqpacket");
    }
}
