//! The guest channel's stream decoder on arbitrary bytes, fed in arbitrary pieces (as reads
//! bring them): no panic, its buffer stays bounded, and every frame it yields is valid and
//! encodes back to bytes that decode to the same frame.
#![no_main]

use cosched_proto::{Event, Frame, StreamDecoder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut d = StreamDecoder::new();
    // The first byte chooses the read size (1..=64), the rest is the stream.
    let Some((&n, bytes)) = data.split_first() else { return };
    for piece in bytes.chunks(n as usize % 64 + 1) {
        d.push(piece);
        while let Some(ev) = d.next_event() {
            if let Event::Frame(f) = ev {
                assert_eq!(Frame::decode(&f.encode()), Ok(f));
            }
        }
        assert!(d.buffered() <= 64 * 1024);
    }
    // Whole 16-byte frames, decoded directly.
    for chunk in bytes.chunks_exact(16) {
        let b: &[u8; 16] = chunk.try_into().unwrap();
        if let Ok(f) = Frame::decode(b) {
            assert_eq!(Frame::decode(&f.encode()), Ok(f));
        }
    }
});
