//! The bare fred connection the benchmarks measure floors and naive locks on.

use fred::interfaces::ClientLike;

/// A fred client configured like redbaton's command connection (TCP_NODELAY).
pub async fn fred_client(url: &str) -> fred::clients::Client {
    let config = fred::prelude::Config::from_url(url).expect("url");
    let client = fred::prelude::Builder::from_config(config)
        .with_connection_config(|c| {
            c.tcp = fred::types::config::TcpConfig {
                nodelay: Some(true),
                ..Default::default()
            };
        })
        .build()
        .expect("fred client");
    client.init().await.expect("connect");
    client
}
