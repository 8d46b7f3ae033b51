//! What the engine asks of each half of a read/write lock: its acquire script and reply, its
//! channel and wake rule, its release and renewal.

use super::*;

impl Kind for ReadLock {
    const KIND: &'static str = "read_lock";
}

#[allow(private_interfaces)] // the hooks name crate-private types: sealed on purpose
impl Hooks for ReadLock {
    type Extra = ();

    fn named(&self) -> &Named {
        &self.half.0.named
    }

    fn explicit_owner(&self) -> Option<&Arc<str>> {
        self.owner.as_ref()
    }

    fn channel(&self, _field: &Arc<str>) -> (Arc<str>, Wake) {
        (self.half.0.channel.clone(), Wake::Lock)
    }

    fn acquire(&self, conn: &Conn, field: &str, lease_ms: i64, _waits: bool) -> Call {
        let base = &self.half.0;
        let prefix = base.timeout_prefix(field);
        let args = vec![
            Value::from(lease_ms),
            Value::from(field),
            Value::from(format!("{field}{WRITE_SUFFIX}")),
        ];
        conn.call(&READ_ACQUIRE, &[&base.named.key, &prefix], args)
    }

    fn decode(&self, reply: Value) -> Result<Reply<()>> {
        decode_counted(self.named(), reply, |_| Some(()))
    }

    fn ops(&self) -> Arc<dyn HoldOps> {
        self.half.clone()
    }
}

impl Kind for WriteLock {
    const KIND: &'static str = "write_lock";
}

#[allow(private_interfaces)] // the hooks name crate-private types: sealed on purpose
impl Hooks for WriteLock {
    type Extra = ();

    fn named(&self) -> &Named {
        &self.half.0.named
    }

    fn explicit_owner(&self) -> Option<&Arc<str>> {
        self.owner.as_ref()
    }

    fn field(&self, owner: Arc<str>) -> Arc<str> {
        format!("{owner}{WRITE_SUFFIX}").into()
    }

    fn owner_part<'a>(&self, field: &'a str) -> &'a str {
        field.strip_suffix(WRITE_SUFFIX).unwrap_or(field)
    }

    fn channel(&self, _field: &Arc<str>) -> (Arc<str>, Wake) {
        (self.half.0.channel.clone(), Wake::Lock)
    }

    fn acquire(&self, conn: &Conn, field: &str, lease_ms: i64, _waits: bool) -> Call {
        let args = vec![
            Value::from(lease_ms),
            Value::from(field),
            Value::from(self.owner_part(field)),
        ];
        conn.call(&WRITE_ACQUIRE, &[&self.half.0.named.key], args)
    }

    fn decode(&self, reply: Value) -> Result<Reply<()>> {
        let named = self.named();
        if let Value::Array(parts) = &reply {
            if parts.first().and_then(Value::as_i64) == Some(-1) {
                return Err(Error::WouldDeadlock {
                    name: named.name().to_owned(),
                    detail: "this owner holds read holds on it, and a read hold cannot be \
                             upgraded: waiting for the write lock would never end (release \
                             the read holds first)"
                        .to_owned(),
                });
            }
        }
        decode_counted(named, reply, |_| Some(()))
    }

    fn ops(&self) -> Arc<dyn HoldOps> {
        self.half.clone()
    }
}

impl HoldOps for ReadHalf {
    fn name(&self) -> &str {
        self.0.named.name()
    }

    fn kind(&self) -> &'static str {
        ReadLock::KIND
    }

    fn release(&self, conn: &Conn, field: &str, max: u32, keep: u32, replicas: Replicas) -> Call {
        let base = &self.0;
        let prefix = base.timeout_prefix(field);
        let args = vec![
            Value::from(field),
            Value::from(i64::from(max)),
            Value::from(i64::from(keep)),
            Value::from_static_str(READ_UNLOCK_MESSAGE),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*base.channel),
        ];
        let keys = [&*base.named.key, &prefix, &*base.timeout_base];
        conn.call_with(&READ_RELEASE, &keys, args, replicas)
    }

    fn renewal(&self) -> Renewal {
        &READ_RENEW
    }

    fn shares_expiry(&self) -> bool {
        // Other readers, or the owner's write hold, keep the hash alive past a read lease.
        true
    }
}

impl HoldOps for WriteHalf {
    fn name(&self) -> &str {
        self.0.named.name()
    }

    fn kind(&self) -> &'static str {
        WriteLock::KIND
    }

    fn release(&self, conn: &Conn, field: &str, max: u32, keep: u32, replicas: Replicas) -> Call {
        let base = &self.0;
        let args = vec![
            Value::from(field),
            Value::from(i64::from(max)),
            Value::from(i64::from(keep)),
            Value::from_static_str(WRITE_UNLOCK_MESSAGE),
            Value::from_static_str(conn.publish_command()),
            Value::from(&*base.channel),
        ];
        conn.call_with(&WRITE_RELEASE, &[&*base.named.key], args, replicas)
    }

    fn renewal(&self) -> Renewal {
        // The writer field lives on the hash alone: the RLock's renewal fits.
        &RENEW
    }

    fn shares_expiry(&self) -> bool {
        // The writer's own read holds keep the hash alive past its write lease.
        true
    }
}
