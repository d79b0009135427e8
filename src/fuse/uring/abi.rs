//! The kernel's FUSE-over-io_uring interface (`include/uapi/linux/fuse.h`,
//! protocol 7.42 and later), as byte offsets into the buffers layerfs
//! registers. Only what the transport reads or writes is named here.

/// `FUSE_IO_URING_CMD_REGISTER`: give the kernel one entry's buffers and
/// wait for its first request.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: answer the entry's request and
/// wait for its next one.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, then
/// `struct fuse_uring_ent_in_out` (32 bytes).
pub const HEADER_LEN: usize = 288;
/// `in_out`: the request's `fuse_in_header` on fetch, the reply's
/// `fuse_out_header` on commit.
pub const IN_OUT: usize = 0;
/// `op_in`: the request's first argument (its fixed per-operation
/// struct), when it has one.
pub const OP_IN: usize = 128;
pub const OP_IN_LEN: usize = 128;
/// `ring_ent_in_out.commit_id`: the request's `unique`.
pub const COMMIT_ID: usize = 256 + 8;
/// `ring_ent_in_out.payload_sz`: bytes used in the payload buffer, in
/// either direction.
pub const PAYLOAD_SZ: usize = 256 + 16;

/// `struct fuse_in_header` (40 bytes): `len` at 0 is the whole request's
/// length, `opcode` at 4, `unique` at 8.
pub const IN_HEADER_LEN: usize = 40;
/// `struct fuse_out_header` (16 bytes): `len`, `error`, `unique` at 8.
pub const OUT_HEADER_LEN: usize = 16;

/// `struct fuse_uring_cmd_req` in the SQE's command area: `flags` (u64),
/// `commit_id` (u64), `qid` (u16), 6 bytes of padding.
pub fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

pub const FUSE_INIT: u32 = 26;
pub const FUSE_DESTROY: u32 = 38;

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A request with no arguments but its header (`FUSE_DESTROY`), or
/// `FUSE_INIT` with `struct fuse_init_in` (64 bytes: major, minor,
/// max_readahead, flags, flags2, unused[11]).
pub fn init_request(unique: u64, minor: u32, max_readahead: u32, flags: u64) -> Vec<u8> {
    let mut b = in_header(FUSE_INIT, unique, IN_HEADER_LEN + 64);
    let init_ext: u64 = 1 << 30;
    let flags = flags | init_ext;
    for v in [
        7u32,
        minor,
        max_readahead,
        flags as u32,
        (flags >> 32) as u32,
    ] {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    b.resize(IN_HEADER_LEN + 64, 0);
    b
}

pub fn destroy_request(unique: u64) -> Vec<u8> {
    in_header(FUSE_DESTROY, unique, IN_HEADER_LEN)
}

fn in_header(opcode: u32, unique: u64, len: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&opcode.to_ne_bytes());
    b.extend_from_slice(&unique.to_ne_bytes());
    b.resize(IN_HEADER_LEN, 0);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_area_puts_commit_id_and_queue_where_the_kernel_reads_them() {
        let c = cmd_req(0x0102_0304_0506_0708, 3);
        assert_eq!(u64_at(&c, 0), 0, "flags");
        assert_eq!(u64_at(&c, 8), 0x0102_0304_0506_0708);
        assert_eq!(u16::from_ne_bytes([c[16], c[17]]), 3);
        assert!(c[18..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_made_up_init_is_a_well_formed_request() {
        let r = init_request(9, 44, 131072, (1 << 41) | 1);
        assert_eq!(r.len(), 104);
        assert_eq!(u32_at(&r, 0), 104, "len covers header and init_in");
        assert_eq!(u32_at(&r, 4), FUSE_INIT);
        assert_eq!(u64_at(&r, 8), 9);
        assert_eq!(u32_at(&r, 40), 7);
        assert_eq!(u32_at(&r, 44), 44);
        assert_eq!(u32_at(&r, 48), 131072);
        assert_eq!(u32_at(&r, 52), 1 | (1 << 30), "flags with INIT_EXT");
        assert_eq!(u32_at(&r, 56), 1 << 9, "flags2 carries bit 41");
        let d = destroy_request(5);
        assert_eq!(
            (d.len(), u32_at(&d, 0), u32_at(&d, 4)),
            (40, 40, FUSE_DESTROY)
        );
    }
}
