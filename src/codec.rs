//! The codec of the generated stubs: tonic's prost codec with a smaller
//! encode buffer.
//!
//! tonic keeps one encode buffer per open stream, 8 KiB by default, while
//! agentrt's streamed events are tens to hundreds of bytes: with 1 KiB an
//! open `Chat` stream holds 7 KiB less (the buffer grows for a larger
//! message, such as an image, as before). Decoding keeps tonic's defaults.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Bytes reserved per stream for encoding messages.
pub const ENCODE_BUFFER: usize = 1024;
/// tonic's default: encoded messages are sent on once this many are ready.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`tonic_prost::ProstCodec`] with an [`ENCODE_BUFFER`]-byte encode buffer.
#[derive(Debug, Clone, Copy)]
pub struct SmallBufferCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(ENCODE_BUFFER, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::default())
    }
}
