use std::borrow::Cow;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;
use validator::{Validate, ValidationError, ValidationErrors};

use crate::{excerpt, Currency};

/// How much of an offending value a message quotes.
const QUOTED_BYTES: usize = 64;

/// The event the order service publishes once an order is confirmed: charge
/// `total_amount` to `customer_id` for `order_id`, once.
///
/// Its JSON form, as the (Python) order service writes it:
///
/// ```json
/// {"event_id": "0b9f…", "order_id": "5c1e…", "customer_id": "d2a4…", "total_amount": "120.50", "currency": "EUR"}
/// ```
///
/// The three ids are UUIDs of any version, but never the nil UUID (what a
/// producer that forgot to set one sends). `currency` is optional: an
/// active ISO 4217 code in upper case; without it the service's default
/// currency applies. Whether the amount fits its currency's decimals and
/// the service's limits is checked when charging ([`crate::ChargeRules`]).
///
/// `total_amount` may be a JSON string (what pydantic writes for decimals)
/// or a JSON number; either way it is read from its exact text, never
/// through a float, so a number's digits are never rounded. Unknown fields
/// are ignored, so producers can add fields before consumers know them.
/// Serialized, the amount is a string.
///
/// Decoding reads numbers from their raw text, so the `Deserialize` impl
/// works with `serde_json` only. It checks types, not rules: use
/// [`OrderConfirmedEvent::from_json`], which does both.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Validate)]
pub struct OrderConfirmedEvent {
    /// Identifies this event; the charge's idempotency key.
    #[serde(deserialize_with = "decode::event_id")]
    pub event_id: Uuid,
    /// The confirmed order.
    #[serde(deserialize_with = "decode::order_id")]
    pub order_id: Uuid,
    /// Whom to charge.
    #[serde(deserialize_with = "decode::customer_id")]
    pub customer_id: Uuid,
    /// What to charge: strictly positive, with no more decimals than its
    /// currency has (trailing zeros do not count: `120.500` is `120.50`).
    #[serde(deserialize_with = "decode::total_amount")]
    #[validate(custom(function = "validate_total_amount"))]
    pub total_amount: Decimal,
    /// The amount's currency; `None` for the service's default currency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<Currency>,
}

impl OrderConfirmedEvent {
    /// Decodes an event from a JSON payload and checks its rules; the error
    /// says what is wrong, e.g. `total_amount must be positive, got -5.00`.
    pub fn from_json(payload: &[u8]) -> Result<Self, InvalidEvent> {
        let text = std::str::from_utf8(payload)
            .map_err(|error| InvalidEvent::new(format!("payload is not UTF-8: {error}")))?;
        if text.trim().is_empty() {
            return Err(InvalidEvent::new("payload is empty: expected an OrderConfirmedEvent JSON object"));
        }
        // Syntax first, so that JSON errors carry their position in the payload.
        let raw: Box<RawValue> = serde_json::from_str(text).map_err(InvalidEvent::from_json_error)?;
        // serde's derive would also take an array of the four values.
        if !raw.get().starts_with('{') {
            return Err(InvalidEvent::new(format!(
                "payload must be a JSON object, got {}",
                excerpt(raw.get(), QUOTED_BYTES)
            )));
        }
        let event: Self = serde_json::from_str(raw.get()).map_err(InvalidEvent::from_json_error)?;
        event.validate().map_err(InvalidEvent::from_validation_errors)?;
        Ok(event)
    }
}

fn validate_total_amount(amount: &Decimal) -> Result<(), ValidationError> {
    if *amount <= Decimal::ZERO {
        return Err(rule_broken("positive", format!("total_amount must be positive, got {amount}")));
    }
    Ok(())
}

fn rule_broken(code: &'static str, message: String) -> ValidationError {
    ValidationError::new(code).with_message(Cow::Owned(message))
}

/// Why a payload is not a valid [`OrderConfirmedEvent`]: a message for
/// operators, such as `missing field order_id`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidEvent {
    message: String,
}

impl InvalidEvent {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        InvalidEvent { message: message.into() }
    }

    /// What is wrong with the payload.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn from_json_error(error: serde_json::Error) -> Self {
        let (line, column) = (error.line(), error.column());
        let message = error.to_string();
        // serde_json appends the position to every message; syntax errors
        // keep it up front, for data errors the field name says more.
        let detail = message.strip_suffix(&format!(" at line {line} column {column}")).unwrap_or(&message);
        match error.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                InvalidEvent::new(format!("invalid JSON at line {line} column {column}: {detail}"))
            }
            serde_json::error::Category::Data | serde_json::error::Category::Io => {
                InvalidEvent::new(unquote_field_name(detail))
            }
        }
    }

    pub(crate) fn from_validation_errors(errors: ValidationErrors) -> Self {
        let mut fields: Vec<_> = errors.field_errors().into_iter().collect();
        fields.sort_by(|(a, _), (b, _)| a.cmp(b));
        let messages: Vec<String> = fields
            .into_iter()
            .flat_map(|(field, errors)| {
                errors.iter().map(move |error| match &error.message {
                    Some(message) => message.to_string(),
                    None => format!("{field} is invalid ({})", error.code),
                })
            })
            .collect();
        InvalidEvent::new(messages.join("; "))
    }
}

/// serde's "missing field `order_id`" as "missing field order_id".
fn unquote_field_name(message: &str) -> String {
    for prefix in ["missing field `", "duplicate field `"] {
        if let Some(field) = message.strip_prefix(prefix).and_then(|rest| rest.strip_suffix('`')) {
            return format!("{}{field}", &prefix[..prefix.len() - 1]);
        }
    }
    message.to_owned()
}

/// Field decoders with messages that name the field; each reads the field's
/// raw JSON so that amounts keep their exact digits.
mod decode {
    use std::borrow::Cow;

    use rust_decimal::Decimal;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer};
    use serde_json::value::RawValue;
    use uuid::Uuid;

    use super::{AmountProblem, QUOTED_BYTES};
    use crate::excerpt;

    pub(super) fn event_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Uuid, D::Error> {
        uuid(deserializer, "event_id")
    }

    pub(super) fn order_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Uuid, D::Error> {
        uuid(deserializer, "order_id")
    }

    pub(super) fn customer_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Uuid, D::Error> {
        uuid(deserializer, "customer_id")
    }

    fn uuid<'de, D: Deserializer<'de>>(deserializer: D, field: &str) -> Result<Uuid, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        let Some(text) = json_string(&raw) else {
            return Err(D::Error::custom(format_args!(
                "{field} must be a UUID string, got {}",
                excerpt(raw.get(), QUOTED_BYTES)
            )));
        };
        let id = Uuid::parse_str(&text).map_err(|_| {
            D::Error::custom(format_args!("{field} is not a UUID: {}", excerpt(raw.get(), QUOTED_BYTES)))
        })?;
        // The nil UUID is what a producer sends when it forgot to set an id:
        // charging under it would merge unrelated events into one.
        if id.is_nil() {
            return Err(D::Error::custom(format_args!("{field} is the nil UUID, which identifies nothing")));
        }
        Ok(id)
    }

    pub(super) fn total_amount<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Decimal, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        let literal = match json_string(&raw) {
            Some(text) => text,
            None if raw.get().starts_with(|c: char| c == '-' || c.is_ascii_digit()) => Cow::Borrowed(raw.get()),
            None => {
                return Err(D::Error::custom(format_args!(
                    "total_amount must be a decimal string or a JSON number, got {}",
                    excerpt(raw.get(), QUOTED_BYTES)
                )))
            }
        };
        super::parse_amount(&literal).map_err(|problem| {
            let quoted = excerpt(raw.get(), QUOTED_BYTES);
            D::Error::custom(match problem {
                AmountProblem::NotADecimal => format!("total_amount is not a decimal number: {quoted}"),
                AmountProblem::OutOfRange => {
                    format!("total_amount is out of range: {quoted} (at most {})", Decimal::MAX)
                }
                AmountProblem::TooPrecise => {
                    format!("total_amount has more decimal places than any currency has: {quoted}")
                }
            })
        })
    }

    /// The content of a JSON string, `None` for any other JSON value.
    fn json_string(raw: &RawValue) -> Option<Cow<'_, str>> {
        if !raw.get().starts_with('"') {
            return None;
        }
        // Borrow when there is no escape to resolve.
        match <&str>::deserialize(raw) {
            Ok(text) => Some(Cow::Borrowed(text)),
            Err(_) => String::deserialize(raw).ok().map(Cow::Owned),
        }
    }
}

/// Why an amount's text is not a representable decimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AmountProblem {
    NotADecimal,
    OutOfRange,
    /// Has a non-zero digit beyond what [`Decimal`] holds (28 places).
    TooPrecise,
}

/// Reads a decimal written like a JSON number (`-12.5`, `1.25e2`, also
/// Python's `1E+2`) exactly. Trailing zeros past the second decimal are
/// dropped, so `1.000` reads as `1.00`, and the rules see only real digits.
fn parse_amount(text: &str) -> Result<Decimal, AmountProblem> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], Some(&unsigned[at + 1..])),
        None => (unsigned, None),
    };
    let (integer, fraction) = match mantissa.split_once('.') {
        Some((integer, fraction)) => (integer, fraction),
        None => (mantissa, ""),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(integer) || (mantissa.contains('.') && !all_digits(fraction)) {
        return Err(AmountProblem::NotADecimal);
    }
    let exponent: i64 = match exponent {
        None => 0,
        Some(exponent) => {
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if !all_digits(digits) {
                return Err(AmountProblem::NotADecimal);
            }
            // Beyond any decimal's range either way; saturate rather than overflow.
            let magnitude: i64 = digits.parse().unwrap_or(i64::MAX / 2).min(i64::MAX / 2);
            if exponent.starts_with('-') {
                -magnitude
            } else {
                magnitude
            }
        }
    };

    // The value is digits × 10^power.
    let digits = format!("{integer}{fraction}");
    let mut digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(Decimal::ZERO);
    }
    let mut power = exponent - fraction.len() as i64;
    while power < -2 && digits.ends_with('0') {
        digits = &digits[..digits.len() - 1];
        power += 1;
    }
    const MAX_DIGITS: i64 = 29; // Decimal::MAX has 29 digits
    const MAX_SCALE: i64 = Decimal::MAX_SCALE as i64;
    // Too many digits: if some are past the decimals of every currency, that
    // is what to report, since the event would be rejected for it anyway.
    const MOST_MINOR_UNITS: i64 = 4;
    let too_many_digits = if power < -MOST_MINOR_UNITS { AmountProblem::TooPrecise } else { AmountProblem::OutOfRange };
    if power < -MAX_SCALE {
        return Err(AmountProblem::TooPrecise);
    }
    if digits.len() as i64 + power.max(0) > MAX_DIGITS {
        return Err(too_many_digits);
    }

    let mut plain = String::with_capacity(MAX_DIGITS as usize + MAX_SCALE as usize + 3);
    if negative {
        plain.push('-');
    }
    if power >= 0 {
        plain.push_str(digits);
        plain.extend(std::iter::repeat_n('0', power as usize));
    } else {
        let scale = power.unsigned_abs() as usize;
        let padded = format!("{digits:0>width$}", width = scale + 1);
        let (integer, fraction) = padded.split_at(padded.len() - scale);
        plain.push_str(integer);
        plain.push('.');
        plain.push_str(fraction);
    }
    Decimal::from_str_exact(&plain).map_err(|error| match error {
        rust_decimal::Error::ExceedsMaximumPossibleValue | rust_decimal::Error::LessThanMinimumPossibleValue => {
            AmountProblem::OutOfRange
        }
        _ => too_many_digits,
    })
}

#[cfg(test)]
mod tests;
