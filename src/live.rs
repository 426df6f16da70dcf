//! Settings that may change while a part runs (`systemctl reload`): a
//! part keeps an optional `watch` receiver of its settings and takes
//! [`next`] in its loop.

use tokio::sync::watch;

/// The next value handed to `rx`; never, without a receiver (or once its
/// sender is gone).
pub async fn next<T: Clone>(rx: &mut Option<watch::Receiver<T>>) -> T {
    if let Some(rx) = rx {
        if rx.changed().await.is_ok() {
            return rx.borrow_and_update().clone();
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_new_value_is_taken_and_none_is_waited_for_forever() {
        let (tx, rx) = watch::channel(1);
        let mut rx = Some(rx);
        tx.send_replace(2);
        assert_eq!(next(&mut rx).await, 2);
        let mut none: Option<watch::Receiver<i32>> = None;
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(20), next(&mut none)).await;
        assert!(waited.is_err(), "no receiver: no value, ever");
    }
}
