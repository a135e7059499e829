//! A containerd connection as the HTTP/2 layer (h2) writes to it: without vectored writes,
//! so that a small answer leaves in one write.
//!
//! h2 copies a DATA payload shorter than its chain threshold into its write buffer, and
//! writes a longer one on its own before it buffers the next frame: the threshold is
//! 256 bytes on a socket that takes vectored writes, 1024 on one that does not. A Prepare's
//! or Mounts' answer (~300 bytes of overlay options) left in two writes, the trailers
//! after the payload, and containerd's Go client took two reads to finish the call. Here
//! an answer of up to 1018 bytes (1024 with gRPC's 5-byte prefix) leaves in one write
//! with its headers and trailers. A longer payload takes a write more than before: each
//! DATA frame (at most 16 KiB, containerd's frame size) goes as its head and first KiB,
//! then the rest, instead of one `writev` — a 4 KiB Stat three writes instead of two, a
//! 1 MiB List message about 128 instead of 64.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::Connected;

/// `T`, not offering vectored writes: a vectored write takes tokio's default, the first
/// non-empty slice through `poll_write`.
#[derive(Debug)]
pub(crate) struct OneWrite<T>(pub(crate) T);

impl<T: AsyncRead + Unpin> AsyncRead for OneWrite<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for OneWrite<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl Connected for OneWrite<UnixStream> {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn offers_no_vectored_writes_and_passes_bytes_both_ways() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (a, mut b) = UnixStream::pair().unwrap();
            let mut a = OneWrite(a);
            assert!(!a.is_write_vectored());
            let written = a
                .write_vectored(&[IoSlice::new(b""), IoSlice::new(b"abc"), IoSlice::new(b"de")])
                .await
                .unwrap();
            assert_eq!(written, 3);
            a.write_all(b"fg").await.unwrap();
            let mut got = [0u8; 5];
            b.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"abcfg");
            b.write_all(b"back").await.unwrap();
            let mut back = [0u8; 4];
            a.read_exact(&mut back).await.unwrap();
            assert_eq!(&back, b"back");
        });
    }
}
