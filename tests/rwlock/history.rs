//! A contention run checked by its history: writers never overlap, readers do share.

use super::*;

#[derive(Clone, Debug)]
struct Section {
    name: usize,
    /// The task that held it (its own read and write holds may overlap).
    task: u64,
    write: bool,
    start: Instant,
    end: Instant,
}

const NAMES: [&str; 2] = ["contend", "{contend}:b"];

/// A writer's critical section: a non-atomic read-sleep-write increment.
async fn write_section(client: &Client, name: usize, hold: Duration) {
    let counter = format!("counter:{}", NAMES[name]);
    let value: Option<i64> = client.redis().get(&counter).await.unwrap();
    tokio::time::sleep(hold).await;
    let _: () = client
        .redis()
        .set(&counter, value.unwrap_or(0) + 1, None, None, false)
        .await
        .unwrap();
}

async fn contender(client: Client, task: u64, log: Arc<Mutex<Vec<Section>>>) -> (u64, u64) {
    let mut rng = fastrand::Rng::with_seed(task * 7919 + 1);
    let (mut writes, mut misses) = (0, 0);
    for _ in 0..40 {
        let name = rng.usize(0..NAMES.len());
        let rw = client.read_write_lock(NAMES[name]);
        let hold = Duration::from_micros(rng.u64(200..3000));
        let record = |write, start| {
            log.lock().push(Section {
                name,
                task,
                write,
                start,
                end: Instant::now(),
            })
        };
        match rng.u8(0..10) {
            // Readers, most of the time: wait, bounded wait, reentrant.
            0..=2 => {
                let g = rw.read().lock().await.unwrap();
                let start = Instant::now();
                tokio::time::sleep(hold).await;
                record(false, start);
                g.unlock().await.unwrap();
            }
            3..=4 => {
                let wait = Duration::from_millis(rng.u64(0..200));
                match rw.read().try_lock_for(wait).await.unwrap() {
                    Some(g) => {
                        let start = Instant::now();
                        tokio::time::sleep(hold).await;
                        record(false, start);
                        g.unlock().await.unwrap();
                    }
                    None => misses += 1,
                }
            }
            5 => {
                let outer = rw.read().lock().await.unwrap();
                let start = Instant::now();
                let inner = outer.reenter().await.unwrap();
                tokio::time::sleep(hold).await;
                inner.unlock().await.unwrap();
                record(false, start);
                outer.unlock().await.unwrap();
            }
            // Writers: wait, bounded wait, and a writer that reads and downgrades.
            6..=7 => {
                let g = rw.write().lock().await.unwrap();
                let start = Instant::now();
                write_section(&client, name, hold).await;
                writes += 1;
                record(true, start);
                g.unlock().await.unwrap();
            }
            8 => {
                let wait = Duration::from_millis(rng.u64(0..200));
                match rw.write().try_lock_for(wait).await.unwrap() {
                    Some(g) => {
                        let start = Instant::now();
                        write_section(&client, name, hold).await;
                        writes += 1;
                        record(true, start);
                        g.unlock().await.unwrap();
                    }
                    None => misses += 1,
                }
            }
            _ => {
                let w = rw.write().lock().await.unwrap();
                let start = Instant::now();
                write_section(&client, name, hold).await;
                writes += 1;
                let r = w.run(|| async { rw.read().lock().await }).await;
                let r = r.unwrap().unwrap();
                let read_start = Instant::now();
                record(true, start);
                w.unlock().await.unwrap();
                tokio::time::sleep(hold).await;
                record(false, read_start);
                r.unlock().await.unwrap();
            }
        }
    }
    (writes, misses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_history_has_no_writer_overlap_and_readers_do_share() {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let next_task = AtomicU64::new(0);
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = client(&server).await;
        for _ in 0..6 {
            let task = next_task.fetch_add(1, Ordering::Relaxed);
            tasks.push(tokio::spawn(contender(client.clone(), task, log.clone())));
        }
        clients.push(client);
    }
    let mut writes = 0;
    for t in tasks {
        let (w, _misses) = tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("every task finishes")
            .unwrap();
        writes += w;
    }
    let log = log.lock().clone();
    let overlap = |a: &Section, b: &Section| a.start < b.end && b.start < a.end;
    let mut read_overlaps = 0;
    let mut write_sections = 0;
    for (i, a) in log.iter().enumerate() {
        write_sections += u64::from(a.write);
        for b in &log[i + 1..] {
            if a.name != b.name || a.task == b.task || !overlap(a, b) {
                continue;
            }
            assert!(
                !a.write && !b.write,
                "a writer overlapped another holder: {a:?} / {b:?}"
            );
            read_overlaps += 1;
        }
    }
    assert_eq!(write_sections, writes);
    assert!(writes > 0, "some writers got in");
    assert!(
        read_overlaps > 0,
        "readers of different tasks held at once at least once ({} sections)",
        log.len()
    );
    let mut counted = 0;
    for name in NAMES {
        let n: Option<u64> = raw.get(format!("counter:{name}")).await.unwrap();
        counted += n.unwrap_or(0);
    }
    assert_eq!(
        counted, writes,
        "the writers' non-atomic increments are exact"
    );
    for name in NAMES {
        assert!(!exists(&raw, name).await);
    }
    assert!(keys(&raw, "*rwlock_timeout*").await.is_empty());
    for client in clients {
        client.shutdown().await.unwrap();
    }
}
