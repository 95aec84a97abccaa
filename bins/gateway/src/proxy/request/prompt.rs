//! Where a request's prompt sits in its body, for cache-aware routing
//! ([`cache_aware`](crate::proxy::cache_aware)): the members the engine turns into its prompt,
//! in the order it reads them, found by the same `serde_json` pass that reads `model` (each
//! member borrowed as raw JSON, nothing copied), kept as byte ranges of the body.
//!
//! | route | pieces, in order |
//! |---|---|
//! | `/v1/chat/completions`, `/api/chat` | each element of `messages` |
//! | `/v1/messages` | `system`, each element of `messages` |
//! | `/v1/responses` | `instructions`, `input` (a string, or each element of an array) |
//! | `/v1/completions`, `/completion` | `prompt`, a text that grows in place |
//! | `/api/generate` | `system`, `prompt`, a text that grows in place |
//!
//! A message is hashed whole (its last partial block too), since a client resends it byte for
//! byte; a growing text only by its full blocks ([`PrefixBuilder`](slotgate_choose::PrefixBuilder)). The bytes are the JSON as the
//! client wrote it: a conversation's next turn repeats them exactly, which is all the chain
//! needs (the engine's template adds the same around them every time).
//!
//! The request's user (`user`, else `metadata.user_id`) is kept too: it is mixed into the
//! chain's seed, never used alone (see [`cache_aware`](crate::proxy::cache_aware)).

use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use slotgate_choose::{Prefix, Verdict};

use crate::proxy::endpoint::Carries;

/// How a piece is hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Resent byte for byte: hashed whole.
    Message,
    /// Grows in place: hashed by full blocks.
    Text,
    /// A JSON array whose elements are messages (the Responses API's `input`): split when
    /// hashed.
    Elements,
}

/// The prompt's pieces as byte ranges of the body, and the user's id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Prompt {
    /// In the engine's reading order.
    pub(crate) pieces: Vec<(Range<usize>, Shape)>,
    /// The `user` member's (or `metadata.user_id`'s) raw JSON.
    pub(crate) user: Option<Range<usize>>,
}

/// What cache-aware routing decided for a request by its prompt, carried with the request to
/// where it is sent ([`cache_aware`](crate::proxy::cache_aware) makes and reads it).
#[derive(Debug)]
pub(crate) struct Placement {
    /// The prompt's chain.
    pub(crate) prefix: Prefix,
    /// How the request was placed.
    pub(crate) verdict: Verdict,
}

/// The members of a request body that may carry its prompt, as raw JSON borrowed from it
/// (read by the request's one `serde_json` pass, as members of its `Head`).
#[derive(Debug, Default)]
pub(super) struct Members<'a> {
    pub(super) messages: Elements<'a>,
    pub(super) system: Option<&'a RawValue>,
    pub(super) prompt: Option<&'a RawValue>,
    pub(super) instructions: Option<&'a RawValue>,
    pub(super) input: Option<&'a RawValue>,
    pub(super) user: Option<&'a RawValue>,
    pub(super) metadata: Option<&'a RawValue>,
}

impl Members<'_> {
    /// The prompt of a request to a route that `carries` it, as ranges of `body` (which these
    /// members borrow from).
    pub(super) fn prompt(&self, body: &[u8], carries: Carries) -> Prompt {
        let at = |raw: &RawValue| span(body, raw.get().as_bytes());
        let mut pieces = Vec::new();
        let mut message = |raw: Option<&RawValue>| {
            if let Some(raw) = raw.filter(|raw| raw.get() != "null") {
                pieces.push((at(raw), Shape::Message));
            }
        };
        match carries {
            Carries::Nothing => return Prompt::default(),
            Carries::Messages | Carries::SystemAndMessages => {
                if carries == Carries::SystemAndMessages {
                    message(self.system);
                }
                self.messages.0.iter().for_each(|raw| message(Some(raw)));
            }
            Carries::InstructionsAndInput => {
                message(self.instructions);
                if let Some(input) = self.input {
                    let shape = if input.get().starts_with('[') {
                        Shape::Elements
                    } else {
                        Shape::Message
                    };
                    pieces.push((at(input), shape));
                }
            }
            Carries::Prompt | Carries::SystemAndPrompt => {
                if carries == Carries::SystemAndPrompt {
                    message(self.system);
                }
                if let Some(prompt) = self.prompt {
                    pieces.push((text(at(prompt), prompt.get()), Shape::Text));
                }
            }
        }
        Prompt {
            pieces,
            user: self.user(body),
        }
    }

    /// `user`, else `metadata.user_id` (Anthropic's), as a range of `body`.
    fn user(&self, body: &[u8]) -> Option<Range<usize>> {
        #[derive(Deserialize)]
        struct Metadata<'a> {
            #[serde(borrow, default)]
            user_id: Option<&'a RawValue>,
        }
        let user = self.user.or_else(|| {
            // Read only when there is no `user`: a small object, and anything else is ignored.
            let metadata = self.metadata?;
            serde_json::from_str::<Metadata<'_>>(metadata.get())
                .ok()?
                .user_id
        });
        user.filter(|raw| raw.get() != "null")
            .map(|raw| span(body, raw.get().as_bytes()))
    }
}

/// Where `part` (borrowed from `body`) sits in it.
fn span(body: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr().addr() - body.as_ptr().addr();
    start..start + part.len()
}

/// A string's text without its closing quote, so that a prompt extended in place keeps its
/// earlier bytes where they were; anything else (token ids) as it is.
fn text(range: Range<usize>, raw: &str) -> Range<usize> {
    if raw.len() >= 2 && raw.starts_with('"') && raw.ends_with('"') {
        range.start..range.end - 1
    } else {
        range
    }
}

/// The elements of a JSON array as raw JSON; any other value gives none (the engine decides
/// what to make of it), and is skipped without being copied.
#[derive(Debug, Default)]
pub(super) struct Elements<'a>(Vec<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Elements<'a> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ElementsVisitor(std::marker::PhantomData))
    }
}

struct ElementsVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ElementsVisitor<'a> {
    type Value = Elements<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut elements = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(element) = seq.next_element::<&'a RawValue>()? {
            elements.push(element);
        }
        Ok(Elements(elements))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Elements::default())
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Elements::default())
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Elements::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Elements::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Elements::default())
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Elements::default())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Elements::default())
    }
}

/// The elements of the JSON array `raw` as ranges of `body` (which `raw` is part of); none
/// when it is not an array of JSON values.
pub(crate) fn elements(body: &[u8], raw: &[u8]) -> Vec<Range<usize>> {
    let Ok(Elements(elements)) = serde_json::from_slice::<Elements<'_>>(raw) else {
        return Vec::new();
    };
    elements
        .into_iter()
        .map(|element| span(body, element.get().as_bytes()))
        .collect()
}
