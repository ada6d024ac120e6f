//! gpucr's SDMA packets, byte for byte, against an encoding that is not gpucr's: the
//! packets libdrm's amdgpu tests write (tests/fixtures/sdma/libdrm_sdma.h, vendored from
//! libdrm 2.4.114 with its origin and license), compiled here with `cc`.
//!
//! Every packet kind gpucr emits is compared: the linear copy packet (for each count
//! encoding, chosen from the device family as libdrm chooses, and from the SDMA IP
//! version as gpucr's real backend does), as `emit_copy` splits real copies into it, and
//! the NOP that pads an indirect buffer.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use gpucr_abi::amdgpu_drm::sdma::{emit_copy, pad_ib, CountEncoding, COPY_LINEAR_DWORDS};

/// The reference encoder (tests/fixtures/sdma/reference.c), built once per run.
fn reference_encoder() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(build_reference_encoder)
}

fn build_reference_encoder() -> PathBuf {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sdma");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("sdma-reference-{}", std::process::id()));
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(fixtures.join("reference.c"))
        .output()
        .expect("run cc (this test compiles libdrm's SDMA packet encoding)");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The reference encoder's bytes for `cases` (its input lines).
fn reference_bytes(exe: &Path, cases: &str) -> Vec<u8> {
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = cases.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "the reference encoder failed");
    out.stdout
}

/// The bytes of dwords as they lie in the indirect buffer's memory.
fn bytes_of(dwords: &[u32]) -> Vec<u8> {
    dwords.iter().flat_map(|d| d.to_ne_bytes()).collect()
}

/// Device families around the count field's change, with the SDMA IP major version of
/// their GPUs: CI (CIK SDMA, 2), KV (2), VI (SDMA 3), CZ (3), AI (Vega10, SDMA 4), RV
/// (Raven, 4), NV (Navi10, SDMA 5).
const FAMILIES: [(u32, u32); 7] = [
    (120, 2),
    (125, 2),
    (130, 3),
    (135, 3),
    (141, 4),
    (142, 4),
    (143, 5),
];

const MIB: u64 = 1 << 20;

#[test]
fn copy_packets_and_padding_match_libdrms_encoding() {
    let exe = reference_encoder();
    // Copies from one byte to several packets' worth, at addresses below and above
    // 4 GiB and near the top of a 48-bit address space.
    let copies: [(u64, u64, u64); 6] = [
        (0x1000, 0x2000, 1),
        (0x1000, 0x2000, 4096),
        (0x0000_0001_2345_6000, 0x0000_7FFF_8000_1000, 2 * MIB - 1),
        (0xFFFF_F000, 0x0000_7F00_0000_0000, 2 * MIB),
        (0x0000_0008_0000_0000, 0x1000, 2 * MIB + 1),
        (0x0000_7FFF_FF00_0000, 0x0000_0002_0000_0000, 9 * MIB + 123),
    ];
    let mut compared = 0;
    for (family, sdma_major) in FAMILIES {
        let enc = CountEncoding::for_family(family).expect("a family with SDMA copies");
        assert_eq!(
            CountEncoding::for_sdma_version(sdma_major),
            Some(enc),
            "family {family} has SDMA {sdma_major}"
        );
        for (src, dst, len) in copies {
            let mut ib = Vec::new();
            let packets = emit_copy(&mut ib, enc, src, dst, len).unwrap();
            assert_eq!(ib.len(), packets * COPY_LINEAR_DWORDS);
            // The copy cut as gpucr promises (`split_copy`): pieces of the encoding's
            // most bytes, the last one smaller; libdrm's packet for each, then the NOPs
            // that pad the indirect buffer to 8 dwords.
            let mut cases = String::new();
            let (mut at, mut pieces) = (0u64, 0usize);
            while at < len {
                let piece = (len - at).min(u64::from(enc.max_packet_bytes()));
                cases += &format!("copy {family} {} {} {piece}\n", src + at, dst + at);
                at += piece;
                pieces += 1;
            }
            assert_eq!(packets, pieces);
            pad_ib(&mut ib);
            let dwords = pieces * COPY_LINEAR_DWORDS;
            for _ in dwords..dwords.next_multiple_of(8) {
                cases += "nop\n";
            }
            let reference = reference_bytes(exe, &cases);
            let ours = bytes_of(&ib);
            assert_eq!(
                ours, reference,
                "family {family}, copy of {len} bytes from {src:#x} to {dst:#x}: gpucr's \
                 indirect buffer differs from libdrm's packets"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, FAMILIES.len() * copies.len());
}

/// The comparison can fail: libdrm's packet for one family is not gpucr's for a family
/// of the other count encoding.
#[test]
fn the_count_encodings_differ_in_the_reference_too() {
    let exe = reference_encoder();
    let before = reference_bytes(exe, "copy 130 4096 8192 4096\n");
    let after = reference_bytes(exe, "copy 141 4096 8192 4096\n");
    assert_eq!(before.len(), COPY_LINEAR_DWORDS * 4);
    assert_ne!(before, after);
    let mut ib = Vec::new();
    emit_copy(&mut ib, CountEncoding::Bytes, 4096, 8192, 4096).unwrap();
    assert_eq!(bytes_of(&ib), before);
    assert_ne!(bytes_of(&ib), after);
}
