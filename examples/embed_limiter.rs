//! Embedding the slotgate limiter in your own service.
//!
//! A pretend inference backend with two slots sits behind a limiter that allows 2 requests in
//! flight and 3 waiting. Ten requests arrive at once: requests 0 and 1 run, 2 to 4 wait their
//! turn (and say how long they waited), and 5 to 9 are refused at once with `QueueFull` -- the
//! way slotgate answers `503` + `Retry-After` instead of letting the engine queue where nobody
//! can see.
//!
//! Run it with `cargo run --example embed_limiter`.
#![deny(warnings)]

use std::time::Duration;

use slotgate::limiter::{AcquireError, Limiter};

const HOST: &str = "http://127.0.0.1:8081";
const MODEL: &str = "tiny-llama";

/// The pretend backend: every answer takes 200 ms of "GPU time".
async fn backend(request: usize) -> String {
    tokio::time::sleep(Duration::from_millis(200)).await;
    format!("answer to request {request}")
}

#[tokio::main]
async fn main() {
    let limiter: Limiter = Limiter::new();
    limiter.configure(HOST, MODEL, 2, 3);

    let tasks: Vec<_> = (0..10)
        .map(|request| {
            // The request joins the limiter here, in arrival order: a free slot is taken, or a
            // place in the queue reserved, or the queue is full. The task only waits.
            let acquire = limiter.acquire(HOST, MODEL);
            tokio::spawn(async move {
                match acquire.await {
                    Ok(permit) => {
                        let answer = backend(request).await;
                        let waited = permit.waited();
                        // Dropping the permit hands the slot to the next waiter.
                        drop(permit);
                        format!("request {request}: {answer} (waited {waited:?} in the queue)")
                    }
                    Err(AcquireError::QueueFull) => {
                        format!("request {request}: refused at once, queue full: retry later")
                    }
                    Err(other) => format!("request {request}: {other}"),
                }
            })
        })
        .collect();

    println!(
        "in flight: {}, queued: {}, free slots on the host: {}",
        limiter.in_flight(HOST, MODEL),
        limiter.queued(HOST, MODEL),
        limiter.free_slots(HOST)
    );

    for task in tasks {
        match task.await {
            Ok(line) => println!("{line}"),
            Err(e) => println!("task failed: {e}"),
        }
    }
    println!(
        "done: in flight {}, queued {}",
        limiter.in_flight(HOST, MODEL),
        limiter.queued(HOST, MODEL)
    );
}
