//! The HTTP model providers (OpenAI-compatible, Anthropic) and the retry
//! layer in front of them, driven through their public API against the
//! testkit's scripted loopback upstreams.

mod providers {
    mod anthropic;
    mod openai;
    mod retry;
}
