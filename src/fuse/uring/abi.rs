//! The kernel's FUSE-over-io_uring interface (`include/uapi/linux/fuse.h`,
//! protocol 7.42 and later) as `#[repr(C)]` structs, each checked against
//! the kernel's size at compile time. Buffers are read and written through
//! them (`zerocopy`: no byte offsets, no `unsafe`). Only what the
//! transport reads or writes is declared.

use std::mem::size_of;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `FUSE_IO_URING_CMD_REGISTER`: give the kernel one entry's buffers and
/// wait for its first request.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: answer the entry's request and
/// wait for its next one.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

pub const FUSE_INIT: u32 = 26;
pub const FUSE_DESTROY: u32 = 38;

/// `FUSE_URING_IN_OUT_HEADER_SZ`, `FUSE_URING_OP_IN_OUT_SZ`.
pub const IN_OUT_LEN: usize = 128;
pub const OP_IN_LEN: usize = 128;

/// `struct fuse_in_header`: what every request starts with.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InHeader {
    /// The whole request's length, this header included.
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

/// `struct fuse_out_header`: what every reply starts with.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OutHeader {
    /// The whole reply's length, this header included.
    pub len: u32,
    /// 0, or a negated errno.
    pub error: i32,
    pub unique: u64,
}

/// `struct fuse_uring_ent_in_out`: the entry's bookkeeping, written by the
/// kernel on fetch and by layerfs on commit.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct EntInOut {
    pub flags: u64,
    /// The request's id, given back in `CmdReq::commit_id` with the answer.
    pub commit_id: u64,
    /// Bytes used in the payload buffer, in either direction.
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: an entry's header buffer (the first of
/// the two iovecs REGISTER gives the kernel).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ReqHeader {
    /// The request's `InHeader` on fetch, the reply's `OutHeader` on
    /// commit.
    pub in_out: [u8; IN_OUT_LEN],
    /// The request's first argument (its fixed per-operation struct),
    /// when it has one.
    pub op_in: [u8; OP_IN_LEN],
    pub ring_ent_in_out: EntInOut,
}

/// `struct fuse_uring_cmd_req`, in the SQE's 80-byte command area.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CmdReq {
    pub flags: u64,
    /// The `EntInOut::commit_id` of the request answered (0 to register).
    pub commit_id: u64,
    /// The queue (CPU) the entry belongs to.
    pub qid: u16,
    pub padding: [u8; 6],
}

/// `struct fuse_init_in`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
    pub unused: [u32; 11],
}

const _: () = assert!(size_of::<InHeader>() == 40);
const _: () = assert!(size_of::<OutHeader>() == 16);
const _: () = assert!(size_of::<EntInOut>() == 32);
const _: () = assert!(size_of::<ReqHeader>() == 288);
const _: () = assert!(size_of::<CmdReq>() == 24);
const _: () = assert!(size_of::<InitIn>() == 64);

pub const IN_HEADER_LEN: usize = size_of::<InHeader>();
pub const OUT_HEADER_LEN: usize = size_of::<OutHeader>();

impl ReqHeader {
    /// The request the kernel put in the entry.
    pub fn request(&self) -> InHeader {
        InHeader::read_from_prefix(&self.in_out)
            .map(|(h, _)| h)
            .expect("in_out holds an InHeader")
    }

    /// The in-header as the bytes it came in, to forward.
    pub fn request_bytes(&self) -> &[u8] {
        &self.in_out[..IN_HEADER_LEN]
    }

    /// Puts the reply's header (and its payload's size) in the entry for
    /// the commit.
    pub fn set_reply(&mut self, out: OutHeader, payload_sz: usize) {
        out.write_to_prefix(&mut self.in_out)
            .expect("in_out holds an OutHeader");
        self.ring_ent_in_out.payload_sz = payload_sz as u32;
    }
}

/// The reply header at the start of `reply`, if it is long enough.
pub fn reply_header(reply: &[u8]) -> Option<OutHeader> {
    OutHeader::read_from_prefix(reply).ok().map(|(h, _)| h)
}

/// The SQE command area for `commit_id` on queue `qid`.
pub fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    CmdReq {
        commit_id,
        qid,
        ..CmdReq::default()
    }
    .write_to_prefix(&mut c)
    .expect("the command area holds a CmdReq");
    c
}

/// `FUSE_INIT` as the kernel would send it (with `FUSE_INIT_EXT`, so
/// `flags` may use its high half).
pub fn init_request(unique: u64, minor: u32, max_readahead: u32, flags: u64) -> Vec<u8> {
    let flags = flags | 1 << 30;
    let init = InitIn {
        major: 7,
        minor,
        max_readahead,
        flags: flags as u32,
        flags2: (flags >> 32) as u32,
        ..InitIn::default()
    };
    let mut b = in_header(FUSE_INIT, unique, IN_HEADER_LEN + size_of::<InitIn>());
    b.extend_from_slice(init.as_bytes());
    b
}

/// `FUSE_DESTROY`: a request with no arguments but its header.
pub fn destroy_request(unique: u64) -> Vec<u8> {
    in_header(FUSE_DESTROY, unique, IN_HEADER_LEN)
}

fn in_header(opcode: u32, unique: u64, len: usize) -> Vec<u8> {
    InHeader {
        len: len as u32,
        opcode,
        unique,
        ..InHeader::default()
    }
    .as_bytes()
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    #[test]
    fn the_command_area_puts_commit_id_and_queue_where_the_kernel_reads_them() {
        let c = cmd_req(0x0102_0304_0506_0708, 3);
        let (r, rest) = CmdReq::read_from_prefix(&c).unwrap();
        assert_eq!((r.flags, r.commit_id, r.qid), (0, 0x0102_0304_0506_0708, 3));
        // The kernel's layout: commit_id at byte 8, qid at 16, zeros after.
        assert_eq!(c[8..16], 0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(c[16..18], 3u16.to_ne_bytes());
        assert!(c[18..].iter().all(|&b| b == 0) && rest.len() == 56);
    }

    #[test]
    fn the_entry_header_keeps_commit_id_and_payload_size_where_the_kernel_does() {
        let mut h = ReqHeader::new_zeroed();
        h.ring_ent_in_out.commit_id = 7;
        h.set_reply(
            OutHeader {
                len: 20,
                error: -2,
                unique: 9,
            },
            4,
        );
        let b = h.as_bytes();
        assert_eq!(b[256 + 8..256 + 16], 7u64.to_ne_bytes(), "commit_id");
        assert_eq!(b[256 + 16..256 + 20], 4u32.to_ne_bytes(), "payload_sz");
        assert_eq!(b[4..8], (-2i32).to_ne_bytes(), "out header's error");
        assert_eq!(b[8..16], 9u64.to_ne_bytes(), "out header's unique");
    }

    #[test]
    fn a_made_up_init_is_a_well_formed_request() {
        let r = init_request(9, 44, 131072, (1 << 41) | 1);
        assert_eq!(r.len(), 104);
        let (h, rest) = InHeader::read_from_prefix(&r).unwrap();
        assert_eq!((h.len, h.opcode, h.unique), (104, FUSE_INIT, 9));
        let i = InitIn::read_from_bytes(rest).unwrap();
        assert_eq!((i.major, i.minor, i.max_readahead), (7, 44, 131072));
        assert_eq!(i.flags, 1 | (1 << 30), "flags with INIT_EXT");
        assert_eq!(i.flags2, 1 << 9, "flags2 carries bit 41");
        let d = destroy_request(5);
        let (h, rest) = InHeader::read_from_prefix(&d).unwrap();
        assert_eq!(
            (d.len(), h.len, h.opcode, rest.len()),
            (40, 40, FUSE_DESTROY, 0)
        );
    }
}
