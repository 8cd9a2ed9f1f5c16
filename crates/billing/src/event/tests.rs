use proptest::prelude::*;
use rust_decimal::Decimal;
use uuid::Uuid;

use super::OrderConfirmedEvent;
use crate::Currency;

const EVENT_ID: &str = "0b9f6c1e-8a52-4c0e-9a0b-6d2f3b1c4e5a";
const ORDER_ID: &str = "5c1e2d3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f";
const CUSTOMER_ID: &str = "d2a4b6c8-e0f2-4a4c-8e6a-8c0e2a4c6e8a";
const NIL: &str = "00000000-0000-0000-0000-000000000000";

/// A payload with `total_amount` written as `amount` (raw JSON).
fn with_amount(amount: &str) -> String {
    format!(
        r#"{{"event_id":"{EVENT_ID}","order_id":"{ORDER_ID}","customer_id":"{CUSTOMER_ID}","total_amount":{amount}}}"#
    )
}

/// Decodes `payload`; `expected` is the amount as `Decimal` displays it
/// (scale included), or the error message.
#[track_caller]
fn check(payload: impl AsRef<[u8]>, expected: Result<&str, &str>) {
    let payload = payload.as_ref();
    let actual = OrderConfirmedEvent::from_json(payload);
    let shown = String::from_utf8_lossy(payload);
    match (actual, expected) {
        (Ok(event), Ok(amount)) => {
            assert_eq!(event.total_amount.to_string(), amount, "{shown}");
            assert_eq!(event.event_id, Uuid::parse_str(EVENT_ID).unwrap(), "{shown}");
            assert_eq!(event.order_id, Uuid::parse_str(ORDER_ID).unwrap(), "{shown}");
            assert_eq!(event.customer_id, Uuid::parse_str(CUSTOMER_ID).unwrap(), "{shown}");
        }
        (Err(error), Err(message)) => assert_eq!(error.message(), message, "{shown}"),
        (actual, expected) => panic!("{shown}: expected {expected:?}, got {actual:?}"),
    }
}

#[test]
fn amounts() {
    let table: &[(&str, Result<&str, &str>)] = &[
        // What pydantic writes, and what other producers may write.
        (r#""120.50""#, Ok("120.50")),
        ("120.50", Ok("120.50")),
        (r#""120.5""#, Ok("120.5")),
        ("120.5", Ok("120.5")),
        (r#""120""#, Ok("120")),
        ("120", Ok("120")),
        (r#""0.01""#, Ok("0.01")),
        // Trailing zeros are not decimal places.
        (r#""120.500""#, Ok("120.50")),
        (r#""1.0000000000000000000000000000000000000000""#, Ok("1.00")),
        // Exponents: JSON numbers may have them, Python writes Decimal("1E+2").
        ("1.2e2", Ok("120")),
        ("12050E-2", Ok("120.50")),
        (r#""1E+2""#, Ok("100")),
        // Huge but exact.
        (r#""99999999999999999999999999.99""#, Ok("99999999999999999999999999.99")),
        ("79228162514264337593543950335", Ok("79228162514264337593543950335")),
        // Never through a float: 2^53 + 1 as a number keeps its last digit.
        ("9007199254740993.25", Ok("9007199254740993.25")),
        // Rules.
        (r#""0""#, Err("total_amount must be positive, got 0")),
        ("0", Err("total_amount must be positive, got 0")),
        ("0.00", Err("total_amount must be positive, got 0")),
        ("-0", Err("total_amount must be positive, got 0")),
        (r#""-1""#, Err("total_amount must be positive, got -1")),
        ("-5.00", Err("total_amount must be positive, got -5.00")),
        // Whether the decimals fit the currency is checked when charging
        // (`ChargeRules::check`): KWD has three.
        (r#""1.005""#, Ok("1.005")),
        ("1.25e-1", Ok("0.125")),
        ("-1.005", Err("total_amount must be positive, got -1.005")),
        // Beyond what a decimal holds.
        (
            r#""79228162514264337593543950336""#,
            Err(r#"total_amount is out of range: "79228162514264337593543950336" (at most 79228162514264337593543950335)"#),
        ),
        ("1e30", Err("total_amount is out of range: 1e30 (at most 79228162514264337593543950335)")),
        ("1e999999999999999999999", Err("total_amount is out of range: 1e999999999999999999999 (at most 79228162514264337593543950335)")),
        (
            "123456789012345678901234567890.5",
            Err("total_amount is out of range: 123456789012345678901234567890.5 (at most 79228162514264337593543950335)"),
        ),
        ("1e-999999999", Err("total_amount has more decimal places than any currency has: 1e-999999999")),
        (
            "0.00000000000000000000000000000001",
            Err("total_amount has more decimal places than any currency has: 0.00000000000000000000000000000001"),
        ),
        // Not decimals.
        (r#""NaN""#, Err(r#"total_amount is not a decimal number: "NaN""#)),
        (r#""Infinity""#, Err(r#"total_amount is not a decimal number: "Infinity""#)),
        (r#""12,50""#, Err(r#"total_amount is not a decimal number: "12,50""#)),
        (r#""1_000""#, Err(r#"total_amount is not a decimal number: "1_000""#)),
        (r#"" 120.50""#, Err(r#"total_amount is not a decimal number: " 120.50""#)),
        (r#""120.""#, Err(r#"total_amount is not a decimal number: "120.""#)),
        (r#""""#, Err(r#"total_amount is not a decimal number: """#)),
        (r#""1e""#, Err(r#"total_amount is not a decimal number: "1e""#)),
        // Not strings or numbers.
        ("true", Err("total_amount must be a decimal string or a JSON number, got true")),
        ("null", Err("total_amount must be a decimal string or a JSON number, got null")),
        (r#"["120.50"]"#, Err(r#"total_amount must be a decimal string or a JSON number, got ["120.50"]"#)),
        (r#"{"amount":"120.50"}"#, Err(r#"total_amount must be a decimal string or a JSON number, got {"amount":"120.50"}"#)),
    ];
    for &(amount, expected) in table {
        check(with_amount(amount), expected);
    }
}

#[test]
fn payloads() {
    let valid = with_amount(r#""120.50""#);
    let long_id = "x".repeat(100);
    let table: Vec<(Vec<u8>, Result<&str, &str>)> = vec![
        (valid.clone().into(), Ok("120.50")),
        // Forward-compatible: fields we do not know yet are ignored.
        (valid.replace("{", r#"{"currency":"EUR","lines":[{"sku":"A-1"}],"#).into(), Ok("120.50")),
        (valid.replace("{", r#"{"currency":"XYZ","#).into(), Err("XYZ is not an active ISO 4217 currency code")),
        (
            valid.replace("{", r#"{"currency":"eur","#).into(),
            Err(r#""eur" is not a currency code: expected three upper-case letters such as EUR"#),
        ),
        (valid.replace("{", r#"{"currency":null,"#).into(), Ok("120.50")),
        (valid.replace("{", r#"{"currency":978,"#).into(), Err("invalid type: integer `978`, expected a string")),
        // Formatting does not matter.
        (format!("\n  {}\n", valid.replace(",", ",\n  ")).into(), Ok("120.50")),
        // Uppercase and simple-format UUIDs are UUIDs.
        (valid.replace(EVENT_ID, &EVENT_ID.to_uppercase()).into(), Ok("120.50")),
        (valid.replace(EVENT_ID, &EVENT_ID.replace('-', "")).into(), Ok("120.50")),
        // Missing fields.
        (valid.replace(&format!(r#""order_id":"{ORDER_ID}","#), "").into(), Err("missing field order_id")),
        (valid.replace(r#","total_amount":"120.50""#, "").into(), Err("missing field total_amount")),
        (b"{}".to_vec(), Err("missing field event_id")),
        // Wrong types and values.
        (valid.replace(&format!(r#""{ORDER_ID}""#), "42").into(), Err("order_id must be a UUID string, got 42")),
        (
            valid.replace(&format!(r#""{CUSTOMER_ID}""#), "null").into(),
            Err("customer_id must be a UUID string, got null"),
        ),
        (valid.replace(EVENT_ID, "abc").into(), Err(r#"event_id is not a UUID: "abc""#)),
        // The nil UUID identifies nothing, in any spelling.
        (valid.replace(EVENT_ID, NIL).into(), Err("event_id is the nil UUID, which identifies nothing")),
        (
            valid.replace(ORDER_ID, &NIL.replace('-', "")).into(),
            Err("order_id is the nil UUID, which identifies nothing"),
        ),
        (valid.replace(CUSTOMER_ID, NIL).into(), Err("customer_id is the nil UUID, which identifies nothing")),
        (
            valid.replace(EVENT_ID, &long_id).into(),
            Err(r#"event_id is not a UUID: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…"#),
        ),
        (
            valid.replace(r#""total_amount""#, r#""event_id":"x","total_amount""#).into(),
            Err("duplicate field event_id"),
        ),
        // Not an event.
        (b"[]".to_vec(), Err("payload must be a JSON object, got []")),
        (
            format!(r#"["{EVENT_ID}","{ORDER_ID}","{CUSTOMER_ID}","120.50"]"#).into(),
            Err(
                r#"payload must be a JSON object, got ["0b9f6c1e-8a52-4c0e-9a0b-6d2f3b1c4e5a","5c1e2d3f-4a5b-4c6d-8e7f…"#,
            ),
        ),
        (b"42".to_vec(), Err("payload must be a JSON object, got 42")),
        (br#""120.50""#.to_vec(), Err(r#"payload must be a JSON object, got "120.50""#)),
        // Not JSON.
        (br#"{"event_id": }"#.to_vec(), Err("invalid JSON at line 1 column 14: expected value")),
        (b"{".to_vec(), Err("invalid JSON at line 1 column 1: EOF while parsing an object")),
        (br#"{"a":1} {"a":2}"#.to_vec(), Err("invalid JSON at line 1 column 9: trailing characters")),
        (b"order 42 confirmed".to_vec(), Err("invalid JSON at line 1 column 1: expected value")),
        (b"".to_vec(), Err("payload is empty: expected an OrderConfirmedEvent JSON object")),
        (b" \n\t".to_vec(), Err("payload is empty: expected an OrderConfirmedEvent JSON object")),
        (b"\xff\xfe{}".to_vec(), Err("payload is not UTF-8: invalid utf-8 sequence of 1 bytes from index 0")),
        // Latin-1, not UTF-8: "caf\xe9".
        (
            b"{\"note\":\"caf\xe9\"}".to_vec(),
            Err("payload is not UTF-8: invalid utf-8 sequence of 1 bytes from index 12"),
        ),
    ];
    for (payload, expected) in table {
        check(payload, expected);
    }
}

#[test]
fn amounts_in_euros() {
    let table: &[(&str, &str)] = &[
        ("120.50", "120.50"),
        ("120.5", "120.50"),
        ("120", "120.00"),
        ("120.500", "120.50"),
        ("0.01", "0.01"),
        ("79228162514264337593543950335", "79228162514264337593543950335.00"),
    ];
    for &(amount, expected) in table {
        let event = OrderConfirmedEvent::from_json(with_amount(amount).as_bytes()).unwrap();
        assert_eq!(Currency::EUR.format(event.total_amount).as_deref(), Some(expected), "{amount}");
    }
}

fn valid_event() -> impl Strategy<Value = OrderConfirmedEvent> {
    let amount = (1..=i128::from(u64::MAX) * 1_000, 0..=2u32)
        .prop_map(|(mantissa, scale)| Decimal::from_i128_with_scale(mantissa, scale));
    let currency = prop_oneof![Just(None), Just(Some(Currency::EUR)), Just(Some("JPY".parse().unwrap()))];
    let id = || (1..=u128::MAX).prop_map(Uuid::from_u128);
    (id(), id(), id(), amount, currency).prop_map(|(event_id, order_id, customer_id, total_amount, currency)| {
        OrderConfirmedEvent { event_id, order_id, customer_id, total_amount, currency }
    })
}

proptest! {
    #[test]
    fn valid_events_round_trip_through_json(event in valid_event()) {
        let json = serde_json::to_vec(&event).unwrap();
        let decoded = OrderConfirmedEvent::from_json(&json).unwrap();
        prop_assert_eq!(&decoded, &event);
        // The amount keeps its scale, not just its value.
        prop_assert_eq!(decoded.total_amount.to_string(), event.total_amount.to_string());
    }

    #[test]
    fn amounts_as_json_numbers_read_like_strings(event in valid_event()) {
        let as_number = serde_json::to_string(&event)
            .unwrap()
            .replace(&format!(r#""{}""#, event.total_amount), &event.total_amount.to_string());
        prop_assert_eq!(OrderConfirmedEvent::from_json(as_number.as_bytes()).unwrap(), event);
    }

    #[test]
    fn decoding_any_bytes_never_panics(payload in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = OrderConfirmedEvent::from_json(&payload);
    }
}
