//! The protobuf codec of Baton's own services: prost encoding with small per-call buffers.
//!
//! tonic's default codec gives every call an 8 KiB encode buffer for the life of its response
//! stream. Baton's messages are a few hundred bytes and a sidecar may hold 10,000 keepalive
//! streams, so that default alone would cost 80 MiB; this codec starts each buffer at
//! [`BUFFER_SIZE`] bytes (it still grows for a larger message, such as a long completion list).
//!
//! A request that does not decode (a `string` field that is not UTF-8, a truncated or garbled
//! message) is the client's error: it fails `INVALID_ARGUMENT` with prost's reason, where tonic's
//! codec answers `INTERNAL`, the code of a server fault. When prost names the field it stopped
//! at, the message starts with that field and a `BadRequest` detail names it, as for every other
//! invalid field.

use std::marker::PhantomData;

use tonic::{
    Status,
    codec::{BufferSettings, Codec, DecodeBuf, Decoder},
};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::error::Error;

/// Initial size of each call's encode and decode buffer, in bytes.
pub const BUFFER_SIZE: usize = 512;
/// Encoded bytes after which a stream yields to let them be sent (tonic's default).
pub const YIELD_THRESHOLD: usize = 32 * 1024;

/// `ProstCodec` with [`BUFFER_SIZE`] buffers; named by the generated service code.
#[derive(Debug)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = LeanDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        LeanDecoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::new(
            BUFFER_SIZE,
            YIELD_THRESHOLD,
        )))
    }
}

/// `ProstDecoder` whose decoding failures are `INVALID_ARGUMENT`: they come from the bytes the
/// client sent.
#[derive(Debug)]
pub struct LeanDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for LeanDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|e| undecodable(e.message()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// The status of a request that did not decode, from prost's message (`failed to decode Protobuf
/// message: Request.field: reason`, the innermost field first): `INVALID_ARGUMENT` naming the
/// field (`outer.inner` when nested) as [`Error::InvalidArgument`] does, or saying the request
/// does not decode when prost names none (a message cut short).
fn undecodable(message: &str) -> Status {
    let mut rest = message
        .strip_prefix("failed to decode Protobuf message: ")
        .unwrap_or(message);
    let mut fields = Vec::new();
    while let Some((head, tail)) = rest.split_once(": ") {
        match head.split_once('.') {
            Some((message, field)) if identifier(message) && identifier(field) => {
                fields.push(field);
                rest = tail;
            }
            _ => break,
        }
    }
    if fields.is_empty() {
        return Status::invalid_argument(format!("the request does not decode: {rest}"));
    }
    fields.reverse();
    Error::invalid(fields.join("."), rest.to_owned()).into()
}

/// Whether `s` is a protobuf identifier.
fn identifier(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// prost's messages become the field first, nested fields outer first, or the request.
    #[test]
    fn undecodable_names_the_field() {
        let status = undecodable(
            "failed to decode Protobuf message: AutocompleteServiceCompleteRequest.query: invalid \
             string value: data is not UTF-8 encoded",
        );
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "query: invalid string value: data is not UTF-8 encoded"
        );
        let nested = undecodable(
            "failed to decode Protobuf message: AutocompleteTerm.display: \
             AutocompleteServiceAddRequest.terms: invalid string value: data is not UTF-8 encoded",
        );
        assert!(
            nested
                .message()
                .starts_with("terms.display: invalid string"),
            "{nested:?}"
        );
        let whole = undecodable("failed to decode Protobuf message: buffer underflow");
        assert_eq!(whole.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            whole.message(),
            "the request does not decode: buffer underflow"
        );
    }
}
