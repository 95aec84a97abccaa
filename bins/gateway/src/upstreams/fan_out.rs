//! The shape of every background round: one task per item, all at once, and the round ends when
//! the last one does. Health checks, slot-count reads and engine-load reads all use it.

use std::future::Future;

use tokio::task::JoinSet;

/// Runs `task(item)` for every item concurrently and returns when all are done.
///
/// Dropping the returned future (a round cut short at shutdown) aborts the tasks still running.
pub(crate) async fn fan_out<T, F, Fut>(items: impl IntoIterator<Item = T>, task: F)
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    for item in items {
        tasks.spawn(task(item));
    }
    while tasks.join_next().await.is_some() {}
}
