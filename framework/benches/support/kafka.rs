//! What the Kafka benchmarks share (feature `kafka`): making their topics
//! through librdkafka's admin client. It never writes or reads records;
//! each benchmark fills and reads its topics its own way.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

/// Runs an admin future on this thread (rdkafka drives the admin client
/// on its own thread; this only polls).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = Box::pin(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

/// Creates `names`, each with `partitions` partitions and one replica,
/// and waits a moment for the broker's metadata to show them.
pub fn create_topics(brokers: &str, names: &[&str], partitions: i32) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|error| error.to_string())?;
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
        .collect();
    for result in block_on(admin.create_topics(&topics, &AdminOptions::new()))
        .map_err(|error| error.to_string())?
    {
        result.map_err(|(topic, code)| format!("creating {topic}: {code}"))?;
    }
    // Metadata needs a moment to show new topics.
    std::thread::sleep(Duration::from_millis(500));
    Ok(())
}
