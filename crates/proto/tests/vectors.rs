//! Reads the shared byte-exact test vectors (`testdata/wire-v1.json`), which every implementation
//! of the protocol must pass.

use cosched_proto::{Event, Frame, Kind, StreamDecoder, FRAME_LEN};
use serde_json::Value;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/wire-v1.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read vectors")).expect("parse")
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn frame_of(v: &Value) -> Frame {
    let kind = Kind::from_name(v["type"].as_str().unwrap()).expect("known type");
    Frame::new(kind, v["seq"].as_u64().unwrap() as u32, v["value"].as_u64().unwrap())
}

fn arr16(b: &[u8]) -> [u8; FRAME_LEN] {
    b.try_into().expect("16 bytes")
}

#[test]
fn valid_frames_encode_and_decode_byte_exact() {
    let v = vectors();
    let frames = v["frames"].as_array().unwrap();
    assert!(frames.len() >= 20);
    for t in frames {
        let bytes = hex(t["hex"].as_str().unwrap());
        let want = frame_of(t);
        assert_eq!(want.encode().to_vec(), bytes, "encode {}", t["name"]);
        assert_eq!(Frame::decode(&arr16(&bytes)), Ok(want), "decode {}", t["name"]);
    }
}

#[test]
fn invalid_frames_are_refused_with_the_right_error() {
    let v = vectors();
    for t in v["invalid"].as_array().unwrap() {
        let bytes = hex(t["hex"].as_str().unwrap());
        let err = Frame::decode(&arr16(&bytes)).expect_err(t["name"].as_str().unwrap());
        assert_eq!(err.name(), t["error"].as_str().unwrap(), "{}", t["name"]);
        assert_eq!(err.seq().map(u64::from), t["seq"].as_u64(), "seq of {}", t["name"]);
    }
}

fn event_json(ev: &Event) -> Value {
    match ev {
        Event::Frame(f) => serde_json::json!({"frame": {"type": f.kind.name(), "seq": f.seq, "value": f.value}}),
        Event::Malformed(e) => match e.seq() {
            Some(seq) => serde_json::json!({"malformed": e.name(), "seq": seq}),
            None => serde_json::json!({"malformed": e.name()}),
        },
        Event::Garbage { skipped } => serde_json::json!({"garbage": skipped}),
    }
}

#[test]
fn streams_resynchronise_whole_and_byte_by_byte() {
    let v = vectors();
    for t in v["streams"].as_array().unwrap() {
        let bytes = hex(t["hex"].as_str().unwrap());
        let want = t["events"].as_array().unwrap();
        // In one read.
        let mut d = StreamDecoder::new();
        d.push(&bytes);
        let got: Vec<Value> = std::iter::from_fn(|| d.next_event()).map(|e| event_json(&e)).collect();
        assert_eq!(&got, want, "stream {}", t["name"]);
        assert_eq!(d.buffered() as u64, t["buffered_after"].as_u64().unwrap(), "{}", t["name"]);
        // Byte by byte: the same frames come out, and garbage adds up to the same byte count.
        let mut d = StreamDecoder::new();
        let mut got = Vec::new();
        for b in &bytes {
            d.push(std::slice::from_ref(b));
            got.extend(std::iter::from_fn(|| d.next_event()));
        }
        let frames =
            |evs: &[Value]| -> Vec<Value> { evs.iter().filter(|e| e.get("garbage").is_none()).cloned().collect() };
        let garbage = |evs: &[Value]| -> u64 { evs.iter().filter_map(|e| e["garbage"].as_u64()).sum() };
        let got: Vec<Value> = got.iter().map(event_json).collect();
        assert_eq!(frames(&got), frames(want), "byte-by-byte frames of {}", t["name"]);
        assert_eq!(garbage(&got), garbage(want), "byte-by-byte garbage of {}", t["name"]);
    }
}
