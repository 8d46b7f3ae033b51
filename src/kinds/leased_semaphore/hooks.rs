//! What the engine asks of a leased semaphore: its acquire script and reply, its channel,
//! its release and renewal (a permit is a hold, renewed by the watchdog like a lock's).

use super::*;

impl Kind for LeasedSemaphore {
    const KIND: &'static str = "leased_semaphore";
}

#[allow(private_interfaces)] // the hooks name crate-private types: sealed on purpose
impl Hooks for LeasedSemaphore {
    type Extra = PermitId;

    fn named(&self) -> &Named {
        &self.inner.named
    }

    fn explicit_owner(&self) -> Option<&Arc<str>> {
        None
    }

    /// New permits for each acquire: `<client id>:<random permit id in hex>`, the ids one
    /// after the other when several are taken together, so that the holds registry knows the
    /// permits as this client's own (an acquire whose outcome is unknown is settled by
    /// releasing the ids).
    fn field(&self, _owner: Arc<str>) -> Arc<str> {
        use std::fmt::Write;
        let mut field = format!("{}:", self.inner.named.client.id);
        for _ in 0..self.permits {
            write!(field, "{}", PermitId::random()).expect("writing to a String");
        }
        field.into()
    }

    fn channel(&self, _field: &Arc<str>) -> (Arc<str>, Wake) {
        (self.inner.channel.clone(), Wake::Permits)
    }

    fn acquire(&self, conn: &Conn, field: &str, lease_ms: i64, _waits: bool) -> Call {
        let inner = &self.inner;
        let args = vec![
            Value::from(field),
            Value::from(lease_ms),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*inner.channel),
        ];
        let keys = [&*inner.counter, &*inner.named.key];
        conn.call(&ACQUIRE, &keys, args)
    }

    fn decode(&self, reply: Value) -> Result<Reply<PermitId>> {
        let malformed = || {
            Error::Redis(format!(
                "unexpected acquire reply for {:?}",
                self.inner.named.name()
            ))
        };
        let Value::Array(parts) = reply else {
            return Err(malformed());
        };
        let recheck_ms = self.recheck.as_millis() as u64;
        let refused = |ms: Option<i64>| match ms {
            Some(ms) if ms > 0 => Ok((ms as u64).min(recheck_ms)),
            Some(_) => Ok(recheck_ms),
            None => Err(malformed()),
        };
        match parts.first().and_then(Value::as_i64) {
            Some(1) => {
                let id = parts
                    .get(2)
                    .and_then(Value::as_string)
                    .and_then(|hex| hex.parse().ok())
                    .ok_or_else(malformed)?;
                Ok(Reply::Acquired {
                    count: 1,
                    extra: id,
                })
            }
            Some(0) => Ok(Reply::Held(refused(parts.get(1).and_then(Value::as_i64))?)),
            Some(-1) => Ok(Reply::TooFew(refused(
                parts.get(1).and_then(Value::as_i64),
            )?)),
            _ => Err(malformed()),
        }
    }

    fn ops(&self) -> Arc<dyn HoldOps> {
        self.inner.clone()
    }
}

impl HoldOps for Inner {
    fn name(&self) -> &str {
        self.named.name()
    }

    fn kind(&self) -> &'static str {
        LeasedSemaphore::KIND
    }

    fn release(&self, conn: &Conn, field: &str, max: u32, keep: u32, replicas: Replicas) -> Call {
        let args = vec![
            Value::from(field),
            Value::from(i64::from(max)),
            Value::from(i64::from(keep)),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*self.channel),
        ];
        let keys = [&*self.counter, &*self.named.key];
        conn.call_with(&RELEASE, &keys, args, replicas)
    }

    fn renewal(&self) -> Renewal {
        &RENEW
    }
}
