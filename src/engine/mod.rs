//! The engine every kind shares: what a kind is to it ([`kind`]), the wait loop
//! ([`acquire`]) and its round trips ([`call`]), the guard ([`guard`]), hold scopes
//! ([`scope`]), the holds registry ([`holds`]) and the watchdog that renews them
//! ([`watchdog`]), the per-client subscriber ([`hub`]), and the hand-off between tasks of one
//! client ([`baton`]). It knows no kind: each kind plugs in through [`kind::Kind`].

pub(crate) mod acquire;
pub(crate) mod baton;
pub(crate) mod call;
pub(crate) mod client_inner;
pub(crate) mod free;
pub(crate) mod guard;
pub(crate) mod holds;
pub(crate) mod hub;
pub(crate) mod kind;
#[cfg(test)]
pub(crate) mod model;
pub(crate) mod release;
pub(crate) mod repair;
pub(crate) mod scope;
pub(crate) mod wait;
pub(crate) mod watchdog;
