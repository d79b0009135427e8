//! The pass over an untrusted archive's headers before anything is
//! extracted (`prescan`).

use super::{ctx, SnapshotError, META_LIMIT};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// What a pass over an archive's headers found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// Entries the tar reader will yield (extension records not counted).
    pub entries: u64,
    /// Bytes of file data stored in the archive.
    pub data_bytes: u64,
}

/// Reads the archive's headers only (one `pread` per header, seeking over
/// data) and checks its framing before anything is extracted: every
/// extension record (PAX `x`/`g`, GNU long name `L` and long link `K`),
/// which the tar reader loads whole into memory, is at most `META_LIMIT`
/// bytes; no entry's data runs past the end of the file. The framing is
/// the tar reader's (tar 0.4, non-raw iteration): a PAX `size` overrides
/// the next entry's size, GNU sparse entries have extension blocks after
/// their header, and the headers themselves are parsed by `tar::Header`.
///
/// Longer than most functions on purpose: it is one loop over the tar
/// reader's framing state (the offset, a pending PAX `size`), and reads
/// best whole beside that reader, block by block.
pub fn prescan(f: &File) -> Result<Scan, SnapshotError> {
    const BLOCK: u64 = 512;
    let len = f.metadata().map_err(ctx("cannot stat the archive"))?.len();
    let truncated = |at: u64| {
        SnapshotError::Archive(format!(
            "the archive is truncated (it ends at byte {len}, an entry at byte {at} goes \
             beyond): not a complete snapshot"
        ))
    };
    let mut scan = Scan::default();
    let mut pos = 0u64;
    let mut pax_size: Option<u64> = None;
    let (mut long_name, mut long_link, mut pax) = (false, false, false);
    let mut block = [0u8; BLOCK as usize];
    loop {
        let got = read_full_at(f, &mut block, pos).map_err(ctx("cannot read the archive"))?;
        if got == 0 {
            break;
        }
        if got < block.len() || pos + BLOCK > len {
            return Err(truncated(pos));
        }
        if block.iter().all(|&b| b == 0) {
            break;
        }
        let at = pos;
        let h = tar::Header::from_byte_slice(&block);
        let sum = block[..148]
            .iter()
            .chain(&block[156..])
            .fold(0u32, |a, b| a + *b as u32)
            + 8 * 32;
        if h.cksum().ok() != Some(sum) {
            return Err(format!(
                "the archive's header at byte {at} is damaged (checksum mismatch): not a \
                 complete snapshot"
            )
            .into());
        }
        pos += BLOCK;
        let ty = h.entry_type();
        let extension = ty.is_gnu_longname()
            || ty.is_gnu_longlink()
            || ty.is_pax_local_extensions()
            || ty.is_pax_global_extensions();
        let recognized = h.as_gnu().is_some() || h.as_ustar().is_some();
        let mut size = h
            .entry_size()
            .map_err(|source| SnapshotError::Header { at, source })?;
        if !extension {
            if let Some(s) = pax_size {
                size = s;
            }
        }
        if extension && size > META_LIMIT {
            return Err(format!(
                "the archive's entry at byte {at} declares {size} bytes of metadata (PAX \
                 records or a long name), more than the {} MiB layerfs reads: refused",
                META_LIMIT >> 20
            )
            .into());
        }
        let padded = size
            .checked_add(BLOCK - 1)
            .map(|s| s & !(BLOCK - 1))
            .ok_or_else(|| format!("the archive's entry at byte {at} has an absurd size"))?;
        let consumed = recognized
            && (ty.is_gnu_longname() || ty.is_gnu_longlink() || ty.is_pax_local_extensions());
        if consumed {
            let seen = if ty.is_gnu_longname() {
                &mut long_name
            } else if ty.is_gnu_longlink() {
                &mut long_link
            } else {
                &mut pax
            };
            if *seen {
                return Err(format!(
                    "the archive has two extension records for one entry (at byte {at})"
                )
                .into());
            }
            *seen = true;
            if ty.is_pax_local_extensions() {
                let mut data = vec![0u8; size as usize];
                if read_full_at(f, &mut data, pos).map_err(ctx("cannot read the archive"))?
                    < data.len()
                {
                    return Err(truncated(at));
                }
                pax_size = pax_value_size(&data);
            }
        } else {
            if ty.is_gnu_sparse() {
                let gnu = h
                    .as_gnu()
                    .ok_or_else(|| format!("sparse entry at byte {at} without a GNU header"))?;
                if gnu.is_extended() {
                    loop {
                        let got = read_full_at(f, &mut block, pos)
                            .map_err(ctx("cannot read the archive"))?;
                        if got < block.len() {
                            return Err(truncated(at));
                        }
                        pos += BLOCK;
                        // `GnuExtSparseHeader::isextended`, after 21 24-byte records.
                        if block[21 * 24] != 1 {
                            break;
                        }
                    }
                }
            }
            scan.entries += 1;
            if matches!(
                ty,
                tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse
            ) {
                scan.data_bytes = scan.data_bytes.saturating_add(size);
            }
            pax_size = None;
            (long_name, long_link, pax) = (false, false, false);
        }
        pos = pos
            .checked_add(padded)
            .filter(|&p| p <= len)
            .ok_or_else(|| truncated(at))?;
    }
    if long_name || long_link || pax {
        return Err(
            "the archive ends with extension records for an entry that is missing: not a \
             complete snapshot"
                .into(),
        );
    }
    Ok(scan)
}

/// The `size` record of a PAX record set, read as the tar reader reads it
/// (the first `size` key decides; a value that does not parse is none).
fn pax_value_size(data: &[u8]) -> Option<u64> {
    for ext in tar::PaxExtensions::new(data) {
        let ext = ext.ok()?;
        if ext.key() != Ok("size") {
            continue;
        }
        return ext.value().ok()?.parse().ok();
    }
    None
}

/// Reads as much of `buf` as the file has at `off`.
fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
