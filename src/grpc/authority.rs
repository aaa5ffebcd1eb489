//! A valid `:authority` for every Unix-socket client ([`FixAuthority`]).
//!
//! grpc C-core (Python, Ruby, PHP, C#'s Grpc.Core) and grpc-java send the socket's path,
//! percent-encoded, as the `:authority` of a request over a Unix socket (`%2Frun%2Fbaton.sock`).
//! That is no valid authority, and Baton's HTTP/2 server resets such a stream with
//! `PROTOCOL_ERROR` before any handler sees it. So the Unix socket's connections are read through
//! [`FixAuthority`]: it decodes the first request's header block, and when its `:authority` is one
//! the server would refuse, it re-encodes every header block of the connection with `localhost`
//! in its place. Connections whose first authority is valid (every other client) are passed
//! through untouched from that request on.
//!
//! Re-encoded blocks use only HPACK literals that are never indexed, so the server's dynamic table
//! stays empty while this side follows the client's. Blocks are examined up to
//! [`MAX_HEADER_BLOCK`] bytes: a larger one, or one out of place or undecodable, is passed on as
//! it is (the server reports it) before any rewriting, and closes the connection after.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use loona_hpack::{Decoder, encoder::encode_integer_into};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::codegen::http::uri::Authority;

/// The `:authority` given to requests whose own is invalid.
pub const UNIX_AUTHORITY: &str = "localhost";
/// The largest header block (the fragments of a HEADERS frame and its CONTINUATION frames) read
/// on a Unix-socket connection; a gRPC request's is a few hundred bytes.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// Length of the client connection preface (`PRI * HTTP/2.0...`).
const PREFACE_LEN: usize = 24;
/// Length of an HTTP/2 frame header.
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Fragment size of the frames of a re-encoded block: the smallest maximum frame size HTTP/2
/// allows, so every server accepts it.
const MAX_FRAGMENT: usize = 16_384;
/// The HPACK dynamic table size Baton's HTTP/2 server allows clients (the protocol's default).
const HEADER_TABLE_SIZE: usize = 4096;
/// Bytes read from the connection at a time.
const READ_CHUNK: usize = 8192;

/// Where the reader is in the client's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Inside the connection preface, with this many bytes of it left.
    Preface(usize),
    /// At the start of a frame.
    Frames,
    /// Inside the payload of a frame passed on as it is, with this many bytes left.
    Payload(usize),
    /// Everything from here on is passed on as it is.
    Passthrough,
}

/// A header block being collected: its HEADERS frame's fields and the fragments so far.
struct Block {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames exactly as received, passed on when the block needs no change.
    raw: Vec<u8>,
}

/// A Unix-socket connection whose requests all reach the server with a valid `:authority` (see
/// the module's documentation). Writes go through untouched.
pub struct FixAuthority<IO> {
    io: IO,
    /// Bytes read from the client and not yet examined.
    input: Vec<u8>,
    /// Bytes ready for the server, from `output_at` on.
    output: Vec<u8>,
    output_at: usize,
    state: State,
    /// The client's HPACK state, followed until the connection is passed through.
    decoder: Option<Decoder<'static>>,
    /// Whether every header block is re-encoded (the first authority was invalid).
    rewriting: bool,
    block: Option<Block>,
    eof: bool,
}

impl<IO> FixAuthority<IO> {
    /// Reads `io`, a connection that has sent nothing yet, fixing its requests' authority.
    pub fn new(io: IO) -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Self {
            io,
            input: Vec::new(),
            output: Vec::new(),
            output_at: 0,
            state: State::Preface(PREFACE_LEN),
            decoder: Some(decoder),
            rewriting: false,
            block: None,
            eof: false,
        }
    }

    /// Whether the connection's header blocks are being re-encoded.
    pub fn rewriting(&self) -> bool {
        self.rewriting
    }

    /// Moves what can be examined from `input` to `output`.
    fn process(&mut self) -> io::Result<()> {
        loop {
            match self.state {
                State::Passthrough => {
                    self.output.append(&mut self.input);
                    return Ok(());
                }
                State::Preface(left) | State::Payload(left) => {
                    let n = left.min(self.input.len());
                    self.output.extend(self.input.drain(..n));
                    if n < left {
                        self.state = match self.state {
                            State::Preface(_) => State::Preface(left - n),
                            _ => State::Payload(left - n),
                        };
                        return Ok(());
                    }
                    self.state = State::Frames;
                }
                State::Frames => {
                    if !self.next_frame()? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Examines the frame at the start of `input`; false when more bytes are needed first.
    fn next_frame(&mut self) -> io::Result<bool> {
        let Some(header) = self.input.get(..FRAME_HEADER_LEN) else {
            return Ok(false);
        };
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let (kind, flags) = (header[3], header[4]);
        let stream_id =
            u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & !(1 << 31);
        let in_block = self.block.as_ref().map(|b| b.stream_id);
        if kind != HEADERS && kind != CONTINUATION && in_block.is_none() {
            self.output.extend(self.input.drain(..FRAME_HEADER_LEN));
            self.state = State::Payload(len);
            return Ok(true);
        }
        let collected = self.block.as_ref().map_or(0, |b| b.fragment.len());
        if collected + len > MAX_HEADER_BLOCK {
            // Passed on as it is (from this frame on) unless the connection is being rewritten.
            let block = self.block.take();
            self.give_up(block, &[])?;
            return Ok(true);
        }
        if self.input.len() < FRAME_HEADER_LEN + len {
            return Ok(false);
        }
        let frame: Vec<u8> = self.input.drain(..FRAME_HEADER_LEN + len).collect();
        let payload = &frame[FRAME_HEADER_LEN..];
        let continues = kind == CONTINUATION && in_block == Some(stream_id);
        let block = match (kind, self.block.take()) {
            (HEADERS, None) => match headers_fields(flags, payload) {
                Some((priority, fragment)) => Block {
                    stream_id,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    fragment: fragment.to_vec(),
                    raw: Vec::new(),
                },
                None => {
                    self.give_up(None, &frame)?;
                    return Ok(true);
                }
            },
            (_, Some(mut block)) if continues => {
                block.fragment.extend_from_slice(payload);
                block
            }
            // A frame out of place: the server reports it, as it would have without this reader.
            (_, block) => {
                self.give_up(block, &frame)?;
                return Ok(true);
            }
        };
        let mut block = block;
        block.raw.extend_from_slice(&frame);
        if flags & END_HEADERS == 0 {
            self.block = Some(block);
            return Ok(true);
        }
        self.finish(block)?;
        Ok(true)
    }

    /// Passes on a complete header block: as received when the connection needs no rewriting,
    /// re-encoded otherwise.
    fn finish(&mut self, block: Block) -> io::Result<()> {
        let Some(decoder) = self.decoder.as_mut() else {
            return Err(invalid("no HPACK decoder while reading header blocks"));
        };
        let mut fields = Vec::new();
        let decoded = decoder.decode_with_cb(&block.fragment, |name, value| {
            fields.push((name.into_owned(), value.into_owned()));
        });
        if decoded.is_err() {
            if self.rewriting {
                return Err(invalid("a header block that cannot be decoded"));
            }
            // The server decodes it itself and reports the error.
            return self.give_up(Some(block), &[]);
        }
        let mut invalid_authority = false;
        for (name, value) in &mut fields {
            if name.as_slice() == b":authority" && Authority::try_from(value.as_slice()).is_err() {
                invalid_authority = true;
                *value = UNIX_AUTHORITY.as_bytes().to_vec();
            }
        }
        if !self.rewriting && !invalid_authority {
            return self.give_up(Some(block), &[]);
        }
        if !self.rewriting {
            tracing::debug!(
                "a Unix-socket client sent an invalid :authority; its requests get {UNIX_AUTHORITY:?}"
            );
        }
        self.rewriting = true;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        for (name, value) in &fields {
            literal_never_indexed(&mut encoded, name, value);
        }
        frame_block(&mut self.output, &block, &encoded);
        Ok(())
    }

    /// Stops examining: passes on `block`'s frames and `frame` as received, and everything after.
    fn give_up(&mut self, block: Option<Block>, frame: &[u8]) -> io::Result<()> {
        if self.rewriting {
            return Err(invalid("header frames too large or out of place"));
        }
        if let Some(block) = block {
            self.output.extend_from_slice(&block.raw);
        }
        self.output.extend_from_slice(frame);
        self.state = State::Passthrough;
        self.decoder = None;
        Ok(())
    }
}

/// The priority fields and the header block fragment of a HEADERS frame's payload; None when
/// its padding or priority do not fit.
fn headers_fields(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut rest = payload;
    let mut padding = 0;
    if flags & PADDED != 0 {
        let (&n, after) = rest.split_first()?;
        padding = usize::from(n);
        rest = after;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        priority = Some(<[u8; 5]>::try_from(rest.get(..5)?).ok()?);
        rest = &rest[5..];
    }
    let end = rest.len().checked_sub(padding)?;
    Some((priority, &rest[..end]))
}

/// Appends one header field as an HPACK literal never indexed, with a literal name.
fn literal_never_indexed(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x10);
    for text in [name, value] {
        // Writing into a Vec cannot fail.
        let _ = encode_integer_into(text.len(), 7, 0, out);
        out.extend_from_slice(text);
    }
}

/// Appends `encoded` as the header block of `block`'s stream: a HEADERS frame, then CONTINUATION
/// frames as needed.
fn frame_block(out: &mut Vec<u8>, block: &Block, encoded: &[u8]) {
    let first_len = encoded.len().min(MAX_FRAGMENT - 5);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = if rest.is_empty() { END_HEADERS } else { 0 };
    if block.end_stream {
        flags |= END_STREAM;
    }
    let priority: &[u8] = match &block.priority {
        Some(p) => {
            flags |= PRIORITY;
            p
        }
        None => &[],
    };
    frame_header(
        out,
        priority.len() + first.len(),
        HEADERS,
        flags,
        block.stream_id,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_FRAGMENT));
        rest = after;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        frame_header(out, chunk.len(), CONTINUATION, flags, block.stream_id);
        out.extend_from_slice(chunk);
    }
}

/// Appends an HTTP/2 frame header.
fn frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream_id: u32) {
    // `len` is at most MAX_FRAGMENT, well within the 24 bits of the field.
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("Unix-socket client: {what}"),
    )
}

impl<IO: AsyncRead + Unpin> AsyncRead for FixAuthority<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.output_at < this.output.len() {
                let n = buf.remaining().min(this.output.len() - this.output_at);
                buf.put_slice(&this.output[this.output_at..this.output_at + n]);
                this.output_at += n;
                if this.output_at == this.output.len() {
                    this.output.clear();
                    this.output_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.state == State::Passthrough && this.input.is_empty() {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            }
            this.process()?;
            if this.output_at < this.output.len() {
                continue;
            }
            if this.eof {
                // A frame cut short by the end of the connection is dropped with it.
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.eof = true;
            } else {
                this.input.extend_from_slice(read.filled());
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FixAuthority<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use loona_hpack::Encoder;
    use tokio::io::AsyncReadExt;

    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const SOCKET_AUTHORITY: &[u8] = b"%2Ftmp%2Fbaton.sock";

    /// Gives its bytes `step` at a time, as a socket may.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = self
                .step
                .min(self.data.len() - self.at)
                .min(buf.remaining());
            buf.put_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame_header(&mut out, payload.len(), kind, flags, stream_id);
        out.extend_from_slice(payload);
        out
    }

    fn request(path: &str, authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", authority),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (
                b"user-agent",
                b"grpc-python/1.85.1 grpc-c/52.0.0 (linux; chttp2)",
            ),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
    }

    /// What a C-core client sends: the preface, SETTINGS, then for each request a HEADERS frame
    /// encoded with the dynamic table (later requests index the first's fields) and a DATA frame.
    fn client_bytes(authority: &[u8], requests: u32) -> Vec<u8> {
        let mut encoder = Encoder::new();
        let mut out = PREFACE.to_vec();
        out.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]));
        for i in 0..requests {
            let fields = request(&format!("/baton.v1.LockService/Describe{i}"), authority);
            let block = encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
            out.extend(frame(HEADERS, END_HEADERS, 1 + 2 * i, &block));
            out.extend(frame(
                0x0,
                END_STREAM,
                1 + 2 * i,
                &[0, 0, 0, 0, 2, 10, i as u8],
            ));
        }
        out
    }

    async fn through(data: Vec<u8>, step: usize) -> io::Result<Vec<u8>> {
        let mut fixed = FixAuthority::new(Trickle { data, at: 0, step });
        let mut out = Vec::new();
        fixed.read_to_end(&mut out).await?;
        Ok(out)
    }

    /// Every frame of `bytes` (after the preface): (kind, flags, stream, payload).
    fn frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert_eq!(&bytes[..PREFACE_LEN], PREFACE);
        let mut rest = &bytes[PREFACE_LEN..];
        let mut out = Vec::new();
        while !rest.is_empty() {
            let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let id = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            out.push((rest[3], rest[4], id, rest[9..9 + len].to_vec()));
            rest = &rest[9 + len..];
        }
        out
    }

    /// The header lists a server decodes from `bytes`, with a decoder of its own.
    fn server_sees(bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut decoder = Decoder::new();
        let mut lists = Vec::new();
        let mut block = Vec::new();
        for (kind, flags, _, payload) in frames(bytes) {
            if kind == HEADERS || kind == CONTINUATION {
                let (_, fragment) = if kind == HEADERS {
                    headers_fields(flags, &payload).expect("well-formed HEADERS")
                } else {
                    (None, &payload[..])
                };
                block.extend_from_slice(fragment);
                if flags & END_HEADERS != 0 {
                    lists.push(decoder.decode(&block).expect("decodable block"));
                    block.clear();
                }
            }
        }
        lists
    }

    /// Three requests with the socket path as authority, read a few bytes at a time: the server
    /// decodes each with `localhost` in its place and every other field intact, and the DATA
    /// frames are unchanged.
    #[tokio::test]
    async fn invalid_authorities_become_localhost() {
        let sent = client_bytes(SOCKET_AUTHORITY, 3);
        for step in [1, 7, 4096] {
            let got = through(sent.clone(), step).await.expect("read");
            let lists = server_sees(&got);
            assert_eq!(lists.len(), 3);
            for (i, list) in lists.iter().enumerate() {
                let path = format!("/baton.v1.LockService/Describe{i}");
                assert_eq!(
                    list,
                    &request(&path, b"localhost"),
                    "request {i}, step {step}"
                );
            }
            let data =
                |b: &[u8]| -> Vec<_> { frames(b).into_iter().filter(|f| f.0 == 0).collect() };
            assert_eq!(data(&got), data(&sent));
        }
    }

    /// A client whose authority is valid gets its bytes through exactly as sent.
    #[tokio::test]
    async fn valid_authorities_pass_untouched() {
        let sent = client_bytes(b"localhost", 3);
        assert_eq!(through(sent.clone(), 5).await.expect("read"), sent);
        let mut fixed = FixAuthority::new(Trickle {
            data: sent.clone(),
            at: 0,
            step: 4096,
        });
        let mut out = Vec::new();
        fixed.read_to_end(&mut out).await.expect("read");
        assert!(!fixed.rewriting());
    }

    /// A block in a padded HEADERS frame with priority, continued over CONTINUATION frames and
    /// larger than one frame once re-encoded, keeps its stream, priority and END_STREAM.
    #[tokio::test]
    async fn continued_padded_blocks_are_reframed() {
        let mut fields = request("/p", SOCKET_AUTHORITY);
        fields.push((b"x-big".to_vec(), vec![b'v'; 20_000]));
        let block = Encoder::new().encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
        let (a, b) = block.split_at(100);
        let mut headers = vec![3];
        headers.extend_from_slice(&[0, 0, 0, 1, 15]);
        headers.extend_from_slice(a);
        headers.extend_from_slice(&[0; 3]);
        let mut sent = PREFACE.to_vec();
        sent.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &headers));
        for (i, chunk) in b.chunks(8000).enumerate() {
            let last = (i + 1) * 8000 >= b.len();
            let flags = if last { END_HEADERS } else { 0 };
            sent.extend(frame(CONTINUATION, flags, 5, chunk));
        }
        let got = through(sent, 999).await.expect("read");
        let out = frames(&got);
        assert!(out.len() >= 2, "{} frames", out.len());
        let (kind, flags, id, payload) = &out[0];
        assert_eq!((*kind, *id), (HEADERS, 5));
        assert_eq!(
            flags & (PRIORITY | END_STREAM | END_HEADERS),
            PRIORITY | END_STREAM
        );
        assert_eq!(&payload[..5], &[0, 0, 0, 1, 15]);
        assert!(out[1..].iter().all(|f| f.0 == CONTINUATION && f.2 == 5));
        let mut expected = fields;
        expected[3].1 = b"localhost".to_vec();
        assert_eq!(server_sees(&got), vec![expected]);
    }

    /// A header block over the limit: passed on as it is before rewriting, refused after.
    #[tokio::test]
    async fn oversized_blocks() {
        let huge = frame(HEADERS, END_HEADERS, 1, &vec![0x40; MAX_HEADER_BLOCK + 1]);
        let mut sent = PREFACE.to_vec();
        sent.extend(&huge);
        assert_eq!(
            through(sent, 4096).await.expect("read"),
            [PREFACE, &huge].concat()
        );

        let mut sent = client_bytes(SOCKET_AUTHORITY, 1);
        sent.extend(frame(
            HEADERS,
            END_HEADERS,
            3,
            &vec![0x40; MAX_HEADER_BLOCK + 1],
        ));
        let err = through(sent, 4096).await.expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    /// Frames out of place (a CONTINUATION with no HEADERS) reach the server as sent, for it
    /// to report; once rewriting, they close the connection.
    #[tokio::test]
    async fn frames_out_of_place() {
        let stray = frame(CONTINUATION, END_HEADERS, 1, b"\x82");
        let sent = [PREFACE, &stray[..]].concat();
        assert_eq!(through(sent.clone(), 3).await.expect("read"), sent);

        let mut sent = client_bytes(SOCKET_AUTHORITY, 1);
        sent.extend(&stray);
        assert!(through(sent, 3).await.is_err());
    }
}
