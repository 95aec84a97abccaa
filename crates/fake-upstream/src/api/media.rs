//! Audio and images. Transcription and translation (`multipart/form-data`, as OpenAI's API)
//! answer `{"text": ...}` (or the bare text with `response_format=text`); speech answers a short
//! WAV of silence; image generation answers one tiny PNG as `b64_json`. Which kinds serve which
//! is in `openai.rs` (`Endpoint::served_by`); the fake's contents are placeholders, only the
//! shapes are the engines'.

use serde_json::{Value, json};

/// A 1×1 transparent PNG.
const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// A transcription or translation of `bytes` of audio, as JSON.
pub(crate) fn transcription(text: &str) -> Value {
    json!({"text": text})
}

/// The text the fake "hears": one word per token.
pub(crate) fn heard(tokens: u32) -> String {
    (0..tokens).map(crate::openai::token_text).collect()
}

/// 100 ms of 8 kHz, 8-bit mono silence as a WAV file.
pub(crate) fn speech() -> Vec<u8> {
    let samples: u32 = 800;
    let mut wav = Vec::with_capacity(44 + samples as usize);
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&(36 + samples).to_le_bytes());
    wav.extend_from_slice(b"WAVEfmt ");
    wav.extend_from_slice(&16_u32.to_le_bytes());
    wav.extend_from_slice(&1_u16.to_le_bytes()); // PCM
    wav.extend_from_slice(&1_u16.to_le_bytes()); // mono
    wav.extend_from_slice(&8000_u32.to_le_bytes());
    wav.extend_from_slice(&8000_u32.to_le_bytes());
    wav.extend_from_slice(&1_u16.to_le_bytes());
    wav.extend_from_slice(&8_u16.to_le_bytes());
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&samples.to_le_bytes());
    wav.resize(44 + samples as usize, 128);
    wav
}

/// `n` generated images.
pub(crate) fn images(created: u64, n: usize) -> Value {
    let data: Vec<Value> = (0..n.max(1))
        .map(|_| json!({"b64_json": PNG_1X1, "revised_prompt": null}))
        .collect();
    json!({"created": created, "data": data})
}
