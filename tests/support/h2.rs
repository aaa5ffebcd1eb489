//! Raw HTTP/2 for tests that must write the client's frames themselves (a request cut off
//! mid-message, a client that reads slowly and pings): frames, and a gRPC call's request headers.

/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 frame: `kind` (0 DATA, 1 HEADERS, 4 SETTINGS, 6 PING, 8 WINDOW_UPDATE...), `flags`,
/// `stream` and `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a small payload");
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The HPACK block of a gRPC call's request headers to `path` (plain literals, no Huffman).
pub fn grpc_request_headers(path: &str) -> Vec<u8> {
    let mut fields = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "baton"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        // A literal field without indexing, with a new name.
        fields.push(0);
        for text in [name, value] {
            fields.push(u8::try_from(text.len()).expect("a short header"));
            fields.extend_from_slice(text.as_bytes());
        }
    }
    fields
}
