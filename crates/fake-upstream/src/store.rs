//! The Responses API's memory: every response this instance created, by id, with its input
//! items, so `GET /v1/responses/{id}`, `DELETE`, `POST .../cancel`, `GET .../input_items` and a
//! later `previous_response_id` find it here and nowhere else. A gateway that sends a follow-up
//! to another instance gets that instance's 404: how a test proves affinity.
//!
//! vLLM keeps responses only with `VLLM_ENABLE_RESPONSES_API_STORE=1`; the fake keeps them
//! whenever [`FakeConfig::responses_store`](crate::FakeConfig::responses_store) is on (vLLM's
//! default here). llama-server and Ollama keep nothing.

use std::collections::HashMap;

use parking_lot::Mutex;
use serde_json::Value;

/// One remembered response.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    /// The response object as last sent (its final state once done).
    pub(crate) object: Value,
    /// The request's `input`, for `input_items`.
    pub(crate) input: Option<Value>,
}

/// The responses of one instance, bounded so a long test cannot grow it without limit.
#[derive(Debug, Default)]
pub(crate) struct ResponseStore {
    inner: Mutex<HashMap<String, Stored>>,
}

/// More than any test creates; past it the store forgets everything, as a restart would.
const MAX_STORED: usize = 10_000;

impl ResponseStore {
    /// Remembers (or updates) a response.
    pub(crate) fn put(&self, id: &str, stored: Stored) {
        let mut map = self.inner.lock();
        if map.len() >= MAX_STORED && !map.contains_key(id) {
            map.clear();
        }
        map.insert(id.to_owned(), stored);
    }

    /// The response with this id, if this instance created it.
    pub(crate) fn get(&self, id: &str) -> Option<Stored> {
        self.inner.lock().get(id).cloned()
    }

    /// Forgets a response; false if it was not here.
    pub(crate) fn remove(&self, id: &str) -> bool {
        self.inner.lock().remove(id).is_some()
    }

    /// Marks an unfinished response cancelled and returns it.
    pub(crate) fn cancel(&self, id: &str) -> Option<Value> {
        let mut map = self.inner.lock();
        let stored = map.get_mut(id)?;
        if stored.object["status"] == "in_progress" || stored.object["status"] == "queued" {
            stored.object["status"] = Value::from("cancelled");
        }
        Some(stored.object.clone())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn remembers_updates_cancels_and_forgets() {
        let store = ResponseStore::default();
        assert!(store.get("resp_1").is_none());
        store.put(
            "resp_1",
            Stored {
                object: json!({"id": "resp_1", "status": "in_progress"}),
                input: Some(json!("hi")),
            },
        );
        assert_eq!(store.cancel("resp_1").unwrap()["status"], "cancelled");
        assert!(store.remove("resp_1"));
        assert!(!store.remove("resp_1"));
        assert!(store.cancel("resp_1").is_none());
    }
}
