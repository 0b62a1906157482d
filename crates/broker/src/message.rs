//! Messages in this crate's own types: [`Properties`], [`Headers`] and the [`Delivery`] a
//! consume loop hands to its handler. They are converted to and from lapin's here and only
//! here, so that no other crate of the workspace needs lapin to publish, read or copy a
//! message.
//!
//! A header keeps its exact AMQP field type through a round trip ([`HeaderValue`] has one
//! variant per type), because a parked, dead-lettered or replayed copy must carry what the
//! original carried: a consumer elsewhere may read `x-tenant` as a 32-bit integer.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use lapin::BasicProperties;
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Persistent, in AMQP's `delivery-mode` terms.
pub const PERSISTENT: u8 = 2;

/// One header value: one variant per AMQP field type.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValue {
    Bool(bool),
    I8(i8),
    U8(u8),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    F32(f32),
    F64(f64),
    Decimal {
        scale: u8,
        value: u32,
    },
    /// At most 255 bytes on the wire; a longer one is sent as a long string.
    ShortString(String),
    /// Bytes, as AMQP has them; text in practice, but not necessarily UTF-8.
    LongString(Vec<u8>),
    Array(Vec<HeaderValue>),
    /// Seconds since the epoch.
    Timestamp(u64),
    Table(Headers),
    /// RabbitMQ's byte array.
    Bytes(Vec<u8>),
    Void,
}

impl HeaderValue {
    /// Text, as a long string (what every publisher of this workspace writes).
    pub fn text(s: impl Into<String>) -> Self {
        Self::LongString(s.into().into_bytes())
    }

    /// The text of a long or short string (lossy UTF-8); `None` for other types.
    pub fn as_text(&self) -> Option<Cow<'_, str>> {
        match self {
            Self::LongString(bytes) => Some(String::from_utf8_lossy(bytes)),
            Self::ShortString(s) => Some(Cow::Borrowed(s)),
            _ => None,
        }
    }

    /// The integer of any AMQP integer type (a timestamp is not one).
    pub fn as_integer(&self) -> Option<i64> {
        Some(match self {
            Self::I8(v) => i64::from(*v),
            Self::U8(v) => i64::from(*v),
            Self::I16(v) => i64::from(*v),
            Self::U16(v) => i64::from(*v),
            Self::I32(v) => i64::from(*v),
            Self::U32(v) => i64::from(*v),
            Self::I64(v) => *v,
            _ => return None,
        })
    }
}

impl From<&str> for HeaderValue {
    fn from(s: &str) -> Self {
        Self::text(s)
    }
}

impl From<String> for HeaderValue {
    fn from(s: String) -> Self {
        Self::text(s)
    }
}

impl From<bool> for HeaderValue {
    fn from(b: bool) -> Self {
        Self::Bool(b)
    }
}

impl From<i32> for HeaderValue {
    fn from(n: i32) -> Self {
        Self::I32(n)
    }
}

impl From<i64> for HeaderValue {
    fn from(n: i64) -> Self {
        Self::I64(n)
    }
}

impl From<f64> for HeaderValue {
    fn from(f: f64) -> Self {
        Self::F64(f)
    }
}

impl From<&AMQPValue> for HeaderValue {
    fn from(v: &AMQPValue) -> Self {
        match v {
            AMQPValue::Boolean(b) => Self::Bool(*b),
            AMQPValue::ShortShortInt(n) => Self::I8(*n),
            AMQPValue::ShortShortUInt(n) => Self::U8(*n),
            AMQPValue::ShortInt(n) => Self::I16(*n),
            AMQPValue::ShortUInt(n) => Self::U16(*n),
            AMQPValue::LongInt(n) => Self::I32(*n),
            AMQPValue::LongUInt(n) => Self::U32(*n),
            AMQPValue::LongLongInt(n) => Self::I64(*n),
            AMQPValue::Float(f) => Self::F32(*f),
            AMQPValue::Double(f) => Self::F64(*f),
            AMQPValue::DecimalValue(d) => Self::Decimal {
                scale: d.scale,
                value: d.value,
            },
            AMQPValue::ShortString(s) => Self::ShortString(s.as_str().to_owned()),
            AMQPValue::LongString(s) => Self::LongString(s.as_bytes().to_vec()),
            AMQPValue::FieldArray(a) => Self::Array(a.as_slice().iter().map(Self::from).collect()),
            AMQPValue::Timestamp(t) => Self::Timestamp(*t),
            AMQPValue::FieldTable(t) => Self::Table(Headers::from(t)),
            AMQPValue::ByteArray(b) => Self::Bytes(b.as_slice().to_vec()),
            AMQPValue::Void => Self::Void,
        }
    }
}

/// For tests and tools that build AMQP values by hand.
impl From<AMQPValue> for HeaderValue {
    fn from(v: AMQPValue) -> Self {
        Self::from(&v)
    }
}

impl From<&HeaderValue> for AMQPValue {
    fn from(v: &HeaderValue) -> Self {
        match v {
            HeaderValue::Bool(b) => Self::Boolean(*b),
            HeaderValue::I8(n) => Self::ShortShortInt(*n),
            HeaderValue::U8(n) => Self::ShortShortUInt(*n),
            HeaderValue::I16(n) => Self::ShortInt(*n),
            HeaderValue::U16(n) => Self::ShortUInt(*n),
            HeaderValue::I32(n) => Self::LongInt(*n),
            HeaderValue::U32(n) => Self::LongUInt(*n),
            HeaderValue::I64(n) => Self::LongLongInt(*n),
            HeaderValue::F32(f) => Self::Float(*f),
            HeaderValue::F64(f) => Self::Double(*f),
            HeaderValue::Decimal { scale, value } => Self::DecimalValue(DecimalValue {
                scale: *scale,
                value: *value,
            }),
            HeaderValue::ShortString(s) => match ShortString::try_new(s.as_str()) {
                Ok(s) => Self::ShortString(s),
                Err(_) => Self::LongString(LongString::from(s.as_str())),
            },
            HeaderValue::LongString(bytes) => Self::LongString(LongString::from(bytes.clone())),
            HeaderValue::Array(a) => Self::FieldArray(FieldArray::from(
                a.iter().map(Self::from).collect::<Vec<_>>(),
            )),
            HeaderValue::Timestamp(t) => Self::Timestamp(*t),
            HeaderValue::Table(t) => Self::FieldTable(FieldTable::from(t)),
            HeaderValue::Bytes(b) => Self::ByteArray(ByteArray::from(b.clone())),
            HeaderValue::Void => Self::Void,
        }
    }
}

/// Application headers, by name.
///
/// Serialized as lapin serializes an AMQP table, so that what an older version stored (the
/// archive's `amqp_headers`) reads back, and a dedup key hashed over it stays the same.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Headers(BTreeMap<String, HeaderValue>);

impl Headers {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, key: &str) -> Option<&HeaderValue> {
        self.0.get(key)
    }

    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<HeaderValue>) {
        self.0.insert(key.into(), value.into());
    }

    pub fn remove(&mut self, key: &str) -> Option<HeaderValue> {
        self.0.remove(key)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &HeaderValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Keeps only the headers `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &HeaderValue) -> bool) {
        self.0.retain(|k, v| keep(k, v));
    }
}

impl FromIterator<(String, HeaderValue)> for Headers {
    fn from_iter<I: IntoIterator<Item = (String, HeaderValue)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl From<&FieldTable> for Headers {
    fn from(table: &FieldTable) -> Self {
        table
            .inner()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), HeaderValue::from(v)))
            .collect()
    }
}

/// Keys longer than an AMQP short string cannot be sent: they are left out.
impl From<&Headers> for FieldTable {
    fn from(headers: &Headers) -> Self {
        let mut table = FieldTable::default();
        for (key, value) in headers.iter() {
            if let Ok(key) = ShortString::try_new(key) {
                table.insert(key, AMQPValue::from(value));
            }
        }
        table
    }
}

impl Serialize for Headers {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        FieldTable::from(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        FieldTable::deserialize(deserializer).map(|t| Self::from(&t))
    }
}

/// The AMQP basic properties of a message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub headers: Headers,
    pub delivery_mode: Option<u8>,
    pub priority: Option<u8>,
    pub correlation_id: Option<String>,
    pub reply_to: Option<String>,
    pub expiration: Option<String>,
    pub message_id: Option<String>,
    /// Seconds since the epoch.
    pub timestamp: Option<u64>,
    /// AMQP's `type`.
    pub kind: Option<String>,
    pub user_id: Option<String>,
    pub app_id: Option<String>,
    pub cluster_id: Option<String>,
}

impl Properties {
    /// A persistent message's properties, nothing else set.
    pub fn persistent() -> Self {
        Self {
            delivery_mode: Some(PERSISTENT),
            ..Self::default()
        }
    }
}

impl From<&BasicProperties> for Properties {
    fn from(p: &BasicProperties) -> Self {
        let s = |v: &Option<ShortString>| v.as_ref().map(|v| v.as_str().to_owned());
        Self {
            content_type: s(p.content_type()),
            content_encoding: s(p.content_encoding()),
            headers: p.headers().as_ref().map(Headers::from).unwrap_or_default(),
            delivery_mode: *p.delivery_mode(),
            priority: *p.priority(),
            correlation_id: s(p.correlation_id()),
            reply_to: s(p.reply_to()),
            expiration: s(p.expiration()),
            message_id: s(p.message_id()),
            timestamp: *p.timestamp(),
            kind: s(p.kind()),
            user_id: s(p.user_id()),
            app_id: s(p.app_id()),
            cluster_id: s(p.cluster_id()),
        }
    }
}

/// A text property longer than an AMQP short string cannot be sent: it is left out, as the
/// `with_*` setters of [`Outgoing`](crate::Outgoing) always did.
impl From<&Properties> for BasicProperties {
    fn from(p: &Properties) -> Self {
        let short = |v: &Option<String>| v.as_deref().and_then(|v| ShortString::try_new(v).ok());
        let mut out = BasicProperties::default();
        if let Some(v) = short(&p.content_type) {
            out = out.with_content_type(v);
        }
        if let Some(v) = short(&p.content_encoding) {
            out = out.with_content_encoding(v);
        }
        if !p.headers.is_empty() {
            out = out.with_headers(FieldTable::from(&p.headers));
        }
        if let Some(v) = p.delivery_mode {
            out = out.with_delivery_mode(v);
        }
        if let Some(v) = p.priority {
            out = out.with_priority(v);
        }
        if let Some(v) = short(&p.correlation_id) {
            out = out.with_correlation_id(v);
        }
        if let Some(v) = short(&p.reply_to) {
            out = out.with_reply_to(v);
        }
        if let Some(v) = short(&p.expiration) {
            out = out.with_expiration(v);
        }
        if let Some(v) = short(&p.message_id) {
            out = out.with_message_id(v);
        }
        if let Some(v) = p.timestamp {
            out = out.with_timestamp(v);
        }
        if let Some(v) = short(&p.kind) {
            out = out.with_type(v);
        }
        if let Some(v) = short(&p.user_id) {
            out = out.with_user_id(v);
        }
        if let Some(v) = short(&p.app_id) {
            out = out.with_app_id(v);
        }
        if let Some(v) = short(&p.cluster_id) {
            out = out.with_cluster_id(v);
        }
        out
    }
}

/// One delivery, as a consume loop hands it to its handler.
///
/// Its properties are converted from lapin's the first time they are asked for: the consumer
/// runner reads the few it needs from the AMQP frame directly, and pays for no copy.
pub struct Delivery {
    raw: lapin::message::Delivery,
    properties: OnceLock<Properties>,
}

impl Delivery {
    pub fn body(&self) -> &[u8] {
        &self.raw.data
    }

    pub fn routing_key(&self) -> &str {
        self.raw.routing_key.as_str()
    }

    pub fn exchange(&self) -> &str {
        self.raw.exchange.as_str()
    }

    /// Whether the broker delivered it before (to this consumer or another).
    pub fn redelivered(&self) -> bool {
        self.raw.redelivered
    }

    pub fn message_id(&self) -> Option<&str> {
        self.raw
            .properties
            .message_id()
            .as_ref()
            .map(ShortString::as_str)
    }

    pub fn properties(&self) -> &Properties {
        self.properties
            .get_or_init(|| Properties::from(&self.raw.properties))
    }

    pub fn headers(&self) -> &Headers {
        &self.properties().headers
    }

    pub(crate) fn tag(&self) -> u64 {
        self.raw.delivery_tag
    }

    pub(crate) fn amqp(&self) -> &lapin::message::Delivery {
        &self.raw
    }
}

/// For tests and tools that consume with lapin themselves.
impl From<lapin::message::Delivery> for Delivery {
    fn from(raw: lapin::message::Delivery) -> Self {
        Self {
            raw,
            properties: OnceLock::new(),
        }
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("routing_key", &self.routing_key())
            .field("message_id", &self.message_id())
            .field("redelivered", &self.redelivered())
            .field("bytes", &self.body().len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_amqp_type_survives_a_round_trip() {
        let mut nested = FieldTable::default();
        nested.insert("count".into(), AMQPValue::LongLongInt(2));
        let values = [
            AMQPValue::Boolean(true),
            AMQPValue::ShortShortInt(-1),
            AMQPValue::ShortShortUInt(1),
            AMQPValue::ShortInt(-2),
            AMQPValue::ShortUInt(2),
            AMQPValue::LongInt(7),
            AMQPValue::LongUInt(8),
            AMQPValue::LongLongInt(9),
            AMQPValue::Float(1.5),
            AMQPValue::Double(2.5),
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 314,
            }),
            AMQPValue::ShortString("short".into()),
            AMQPValue::LongString("long".into()),
            AMQPValue::FieldArray(vec![AMQPValue::FieldTable(nested.clone())].into()),
            AMQPValue::Timestamp(1_800_000_000),
            AMQPValue::FieldTable(nested),
            AMQPValue::ByteArray(vec![0, 1, 255].into()),
            AMQPValue::Void,
        ];
        let mut table = FieldTable::default();
        for (i, v) in values.iter().enumerate() {
            table.insert(format!("k{i}").into(), v.clone());
        }
        let headers = Headers::from(&table);
        assert_eq!(FieldTable::from(&headers), table);
        // Stored as lapin stores a table, so rows written before read back the same.
        let json = serde_json::to_value(&headers).unwrap();
        assert_eq!(json, serde_json::to_value(&table).unwrap());
        assert_eq!(serde_json::from_value::<Headers>(json).unwrap(), headers);
    }

    #[test]
    fn properties_round_trip_and_overlong_text_is_left_out() {
        let mut p = Properties::persistent();
        p.message_id = Some("m-1".into());
        p.kind = Some("email.send".into());
        p.timestamp = Some(5);
        p.headers.insert("x-tenant", HeaderValue::I32(7));
        assert_eq!(Properties::from(&BasicProperties::from(&p)), p);
        p.correlation_id = Some("c".repeat(300));
        assert_eq!(BasicProperties::from(&p).correlation_id(), &None);
    }
}
