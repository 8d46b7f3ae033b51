//! The scenarios of the other files on a Redis Cluster (three primaries), once with classic
//! pub/sub and once with sharded pub/sub (Redisson's `shardedSubscriptionMode` set to match:
//! `SSUBSCRIBE` and `SPUBLISH` on both sides), with plain names and names with a hash tag.

use redbaton::{FairLock, FencedLock, Lock, PubSubMode, WriteLock};

use super::*;

async fn everything_on_a_cluster(mode: PubSubMode) {
    let env = Env::cluster(mode).await;
    for name in ["orders:42", "{orders}:42"] {
        locks::exclusion_and_wake_ups::<Lock>(&env, &format!("lock:{name}")).await;
        locks::exclusion_and_wake_ups::<FairLock>(&env, &format!("fair:{name}")).await;
        locks::exclusion_and_wake_ups::<FencedLock>(&env, &format!("fenced:{name}")).await;
        locks::exclusion_and_wake_ups::<WriteLock>(&env, &format!("write:{name}")).await;
    }
    locks::reentry_and_inspection::<Lock>(&env, "{lock}:reentry").await;
    locks::reentry_and_inspection::<WriteLock>(&env, "write:reentry").await;
    locks::force_unlock_from_either_side::<FairLock>(&env, "{fair}:stuck").await;
    rwlock::readers_share_across_both_sides(&env, "{catalog}:shared").await;
    rwlock::a_writers_release_wakes_every_reader(&env, "catalog:w").await;
    rwlock::a_readers_release_wakes_the_writer(&env, "{catalog}:r").await;
    fenced::tokens_increase_across_both_sides(&env, "{ledger}:7").await;
    fair::queue_order_holds_across_both_sides(&env, "deploy:prod").await;
    semaphores::semaphore_permits_add_up(&env, "{crawler}:slots").await;
    semaphores::leased_permits_add_up(&env, "gpu-slots").await;
    // Parts in different slots (and so on different primaries).
    multi::multi_locks_exclude_and_wake_each_other(&env, ["multi:a", "{multi}:b"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_cluster_with_classic_pubsub() {
    everything_on_a_cluster(PubSubMode::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_cluster_with_sharded_pubsub() {
    if !support::servers::supports(support::servers::Feature::ShardedPubSub, None) {
        return;
    }
    everything_on_a_cluster(PubSubMode::Sharded).await;
}
