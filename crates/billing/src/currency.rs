//! Currencies and the business limits of a charge: which ISO 4217
//! currencies this service charges in, how many decimals each has, and the
//! most one charge may be.

use std::{collections::BTreeMap, fmt, str::FromStr};

use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An active ISO 4217 currency, with its minor units (the decimals an
/// amount in it may have: 2 for EUR, 0 for JPY, 3 for KWD).
///
/// ```
/// use billing::Currency;
///
/// let yen: Currency = "JPY".parse().unwrap();
/// assert_eq!((yen.code(), yen.minor_units()), ("JPY", 0));
/// assert!("eur".parse::<Currency>().is_err()); // codes are upper case
/// assert!("XYZ".parse::<Currency>().is_err()); // not an ISO 4217 code
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Currency {
    code: &'static str,
    minor_units: u8,
}

impl Currency {
    /// The euro, the default currency of [`ChargeRules::default`].
    pub const EUR: Currency = Currency { code: "EUR", minor_units: 2 };

    /// The three-letter code, e.g. `EUR`.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// How many decimals an amount in this currency may have.
    pub fn minor_units(&self) -> u32 {
        u32::from(self.minor_units)
    }

    /// `amount` written with exactly [`minor_units`](Self::minor_units)
    /// decimals (`120.5` EUR as `120.50`, `1200.00` JPY as `1200`), or `None`
    /// when it has more significant decimals than the currency.
    pub fn format(&self, amount: Decimal) -> Option<String> {
        let mut amount = amount.normalize();
        if amount.scale() > self.minor_units() {
            return None;
        }
        amount.rescale(self.minor_units());
        // A rescale that would overflow leaves fewer decimals than asked.
        let mut text = amount.to_string();
        let missing = self.minor_units() - amount.scale();
        if missing > 0 {
            if amount.scale() == 0 {
                text.push('.');
            }
            text.extend(std::iter::repeat_n('0', missing as usize));
        }
        Some(text)
    }
}

impl fmt::Debug for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code)
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code)
    }
}

impl FromStr for Currency {
    type Err = String;

    fn from_str(code: &str) -> Result<Self, String> {
        let shown = crate::excerpt(code, 16);
        if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!("{shown:?} is not a currency code: expected three upper-case letters such as EUR"));
        }
        ISO_4217
            .binary_search_by(|(known, _)| known.cmp(&code))
            .map(|at| Currency { code: ISO_4217[at].0, minor_units: ISO_4217[at].1 })
            .map_err(|_| format!("{code} is not an active ISO 4217 currency code"))
    }
}

impl Serialize for Currency {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.code)
    }
}

impl<'de> Deserialize<'de> for Currency {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = String::deserialize(deserializer)?;
        code.parse().map_err(serde::de::Error::custom)
    }
}

/// The most one charge may be (`BILLING_MAX_AMOUNT`): one amount for every
/// currency, or one per currency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaxAmount {
    /// The same number in whichever currency the charge is in.
    Every(Decimal),
    /// A limit per currency; every accepted currency needs one.
    PerCurrency(BTreeMap<Currency, Decimal>),
}

impl MaxAmount {
    fn get(&self, currency: Currency) -> Option<Decimal> {
        match self {
            MaxAmount::Every(max) => Some(*max),
            MaxAmount::PerCurrency(limits) => limits.get(&currency).copied(),
        }
    }
}

impl FromStr for MaxAmount {
    type Err = String;

    /// `10000` (every currency) or `EUR=10000,JPY=1500000`.
    fn from_str(text: &str) -> Result<Self, String> {
        let amount = |text: &str| -> Result<Decimal, String> {
            match Decimal::from_str_exact(text.trim()) {
                Ok(max) if max > Decimal::ZERO => Ok(max),
                _ => Err(format!("maximum amount {:?} is not a positive decimal number", crate::excerpt(text, 32))),
            }
        };
        if !text.contains('=') {
            return amount(text).map(MaxAmount::Every);
        }
        let mut limits = BTreeMap::new();
        for pair in text.split(',') {
            let (code, max) =
                pair.split_once('=').ok_or_else(|| format!("{:?} is not CURRENCY=AMOUNT", crate::excerpt(pair, 32)))?;
            let currency: Currency = code.trim().parse()?;
            if limits.insert(currency, amount(max)?).is_some() {
                return Err(format!("{currency} has two maximum amounts"));
            }
        }
        Ok(MaxAmount::PerCurrency(limits))
    }
}

/// The business rules of a charge: the currencies charged in (the first is
/// the default for events without one) and the most one charge may be.
///
/// ```
/// use billing::{ChargeRules, Currency, MaxAmount};
///
/// let usd: Currency = "USD".parse().unwrap();
/// let rules = ChargeRules::new(vec![Currency::EUR, usd], "EUR=10000,USD=12000".parse().unwrap()).unwrap();
/// assert_eq!(rules.default_currency(), Currency::EUR);
/// assert!(ChargeRules::new(vec![usd], "EUR=10000".parse().unwrap()).is_err()); // no limit for USD
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRules {
    currencies: Vec<Currency>,
    max_amount: MaxAmount,
}

impl Default for ChargeRules {
    /// Euros only, at most 10,000 per charge.
    fn default() -> Self {
        ChargeRules { currencies: vec![Currency::EUR], max_amount: MaxAmount::Every(Decimal::from(10_000)) }
    }
}

impl ChargeRules {
    /// Rules for `currencies` (at least one, no repeats; the first is the
    /// default) with `max_amount`, which must name every one of them when
    /// given per currency.
    pub fn new(currencies: Vec<Currency>, max_amount: MaxAmount) -> Result<Self, String> {
        if currencies.is_empty() {
            return Err("at least one currency must be accepted".into());
        }
        for (at, currency) in currencies.iter().enumerate() {
            if currencies[..at].contains(currency) {
                return Err(format!("{currency} is listed twice"));
            }
            if max_amount.get(*currency).is_none() {
                return Err(format!("{currency} is accepted but has no maximum amount"));
            }
        }
        if let MaxAmount::PerCurrency(limits) = &max_amount {
            if let Some(extra) = limits.keys().find(|c| !currencies.contains(c)) {
                return Err(format!("{extra} has a maximum amount but is not an accepted currency"));
            }
        }
        Ok(ChargeRules { currencies, max_amount })
    }

    /// The currency of an event that names none.
    pub fn default_currency(&self) -> Currency {
        self.currencies[0]
    }

    /// The accepted currencies, the default first.
    pub fn currencies(&self) -> &[Currency] {
        &self.currencies
    }

    /// What `amount` in `currency` (the default when `None`) comes to under
    /// these rules: the amount as the provider wants it, or why it may not be
    /// charged.
    pub fn check(&self, amount: Decimal, currency: Option<Currency>) -> Result<Money, RuleBroken> {
        let currency = currency.unwrap_or(self.default_currency());
        if !self.currencies.contains(&currency) {
            return Err(RuleBroken::CurrencyNotAccepted { currency, accepted: self.currencies.clone() });
        }
        let Some(text) = currency.format(amount) else {
            return Err(RuleBroken::TooManyDecimals { amount, currency });
        };
        let max = self.max_amount.get(currency).expect("every accepted currency has a maximum");
        if amount > max {
            return Err(RuleBroken::AboveMaximum { amount: text, currency, max });
        }
        Ok(Money { amount: text, currency })
    }
}

/// An amount that passed the [`ChargeRules`]: as the provider gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Money {
    /// The amount with exactly the currency's decimals, e.g. `120.50`.
    pub amount: String,
    /// Its currency.
    pub currency: Currency,
}

/// Why an amount may not be charged: every one is permanent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleBroken {
    /// The event's currency is not one this service charges in.
    #[error("currency {currency} is not accepted (accepted: {})", list(accepted))]
    CurrencyNotAccepted {
        /// The event's currency.
        currency: Currency,
        /// The configured ones.
        accepted: Vec<Currency>,
    },
    /// The amount has more decimals than its currency.
    #[error("total_amount {amount} has more decimal places than {currency} has ({})", currency.minor_units())]
    TooManyDecimals {
        /// The event's amount.
        amount: Decimal,
        /// Its currency.
        currency: Currency,
    },
    /// The amount is above the configured maximum.
    #[error("total_amount {amount} {currency} is above the maximum charge of {max} {currency}: not charged")]
    AboveMaximum {
        /// The event's amount, formatted.
        amount: String,
        /// Its currency.
        currency: Currency,
        /// The maximum for that currency.
        max: Decimal,
    },
}

fn list(currencies: &[Currency]) -> String {
    currencies.iter().map(Currency::code).collect::<Vec<_>>().join(", ")
}

/// Active ISO 4217 codes with their minor units, sorted by code. Funds and
/// precious metals without minor units (XAU, XDR...) are left out: nobody
/// is charged in them.
#[rustfmt::skip]
const ISO_4217: &[(&str, u8)] = &[
    ("AED", 2), ("AFN", 2), ("ALL", 2), ("AMD", 2), ("AOA", 2), ("ARS", 2), ("AUD", 2), ("AWG", 2),
    ("AZN", 2), ("BAM", 2), ("BBD", 2), ("BDT", 2), ("BGN", 2), ("BHD", 3), ("BIF", 0), ("BMD", 2),
    ("BND", 2), ("BOB", 2), ("BOV", 2), ("BRL", 2), ("BSD", 2), ("BTN", 2), ("BWP", 2), ("BYN", 2),
    ("BZD", 2), ("CAD", 2), ("CDF", 2), ("CHE", 2), ("CHF", 2), ("CHW", 2), ("CLF", 4), ("CLP", 0),
    ("CNY", 2), ("COP", 2), ("COU", 2), ("CRC", 2), ("CUP", 2), ("CVE", 2), ("CZK", 2), ("DJF", 0),
    ("DKK", 2), ("DOP", 2), ("DZD", 2), ("EGP", 2), ("ERN", 2), ("ETB", 2), ("EUR", 2), ("FJD", 2),
    ("FKP", 2), ("GBP", 2), ("GEL", 2), ("GHS", 2), ("GIP", 2), ("GMD", 2), ("GNF", 0), ("GTQ", 2),
    ("GYD", 2), ("HKD", 2), ("HNL", 2), ("HTG", 2), ("HUF", 2), ("IDR", 2), ("ILS", 2), ("INR", 2),
    ("IQD", 3), ("IRR", 2), ("ISK", 0), ("JMD", 2), ("JOD", 3), ("JPY", 0), ("KES", 2), ("KGS", 2),
    ("KHR", 2), ("KMF", 0), ("KPW", 2), ("KRW", 0), ("KWD", 3), ("KYD", 2), ("KZT", 2), ("LAK", 2),
    ("LBP", 2), ("LKR", 2), ("LRD", 2), ("LSL", 2), ("LYD", 3), ("MAD", 2), ("MDL", 2), ("MGA", 2),
    ("MKD", 2), ("MMK", 2), ("MNT", 2), ("MOP", 2), ("MRU", 2), ("MUR", 2), ("MVR", 2), ("MWK", 2),
    ("MXN", 2), ("MXV", 2), ("MYR", 2), ("MZN", 2), ("NAD", 2), ("NGN", 2), ("NIO", 2), ("NOK", 2),
    ("NPR", 2), ("NZD", 2), ("OMR", 3), ("PAB", 2), ("PEN", 2), ("PGK", 2), ("PHP", 2), ("PKR", 2),
    ("PLN", 2), ("PYG", 0), ("QAR", 2), ("RON", 2), ("RSD", 2), ("RUB", 2), ("RWF", 0), ("SAR", 2),
    ("SBD", 2), ("SCR", 2), ("SDG", 2), ("SEK", 2), ("SGD", 2), ("SHP", 2), ("SLE", 2), ("SOS", 2),
    ("SRD", 2), ("SSP", 2), ("STN", 2), ("SVC", 2), ("SYP", 2), ("SZL", 2), ("THB", 2), ("TJS", 2),
    ("TMT", 2), ("TND", 3), ("TOP", 2), ("TRY", 2), ("TTD", 2), ("TWD", 2), ("TZS", 2), ("UAH", 2),
    ("UGX", 0), ("USD", 2), ("USN", 2), ("UYI", 0), ("UYU", 2), ("UYW", 4), ("UZS", 2), ("VED", 2),
    ("VES", 2), ("VND", 0), ("VUV", 0), ("WST", 2), ("XAF", 0), ("XCD", 2), ("XCG", 2), ("XOF", 0),
    ("XPF", 0), ("YER", 2), ("ZAR", 2), ("ZMW", 2), ("ZWG", 2),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_table_is_sorted_for_its_binary_search() {
        assert!(ISO_4217.windows(2).all(|w| w[0].0 < w[1].0));
    }

    /// A code and what it parses to: the code and its minor units, or the error.
    type CodeCase<'a> = (&'a str, Result<(&'a str, u32), &'a str>);

    /// An amount, a currency, and the money or the error.
    type CheckCase<'a> = (&'a str, Option<Currency>, Result<(&'a str, &'a str), &'a str>);

    #[test]
    fn codes() {
        let table: &[CodeCase<'_>] = &[
            ("EUR", Ok(("EUR", 2))),
            ("JPY", Ok(("JPY", 0))),
            ("KWD", Ok(("KWD", 3))),
            ("CLF", Ok(("CLF", 4))),
            ("eur", Err(r#""eur" is not a currency code: expected three upper-case letters such as EUR"#)),
            ("EURO", Err(r#""EURO" is not a currency code: expected three upper-case letters such as EUR"#)),
            ("", Err(r#""" is not a currency code: expected three upper-case letters such as EUR"#)),
            ("XYZ", Err("XYZ is not an active ISO 4217 currency code")),
            ("XAU", Err("XAU is not an active ISO 4217 currency code")),
        ];
        for &(code, expected) in table {
            let got = code.parse::<Currency>().map(|c| (c.code(), c.minor_units()));
            assert_eq!(got, expected.map_err(str::to_owned), "{code}");
        }
    }

    fn rules(currencies: &str, max: &str) -> Result<ChargeRules, String> {
        let currencies = currencies.split(',').map(str::parse).collect::<Result<Vec<Currency>, _>>()?;
        ChargeRules::new(currencies, max.parse()?)
    }

    #[test]
    fn rule_sets() {
        let table: &[(&str, &str, Result<(), &str>)] = &[
            ("EUR", "10000", Ok(())),
            ("EUR,USD", "EUR=10000, USD=12000", Ok(())),
            ("EUR,USD", "EUR=10000", Err("USD is accepted but has no maximum amount")),
            ("EUR", "EUR=10000,USD=1", Err("USD has a maximum amount but is not an accepted currency")),
            ("EUR,EUR", "10", Err("EUR is listed twice")),
            ("EUR", "0", Err(r#"maximum amount "0" is not a positive decimal number"#)),
            ("EUR", "-5", Err(r#"maximum amount "-5" is not a positive decimal number"#)),
            ("EUR", "1E+9", Err(r#"maximum amount "1E+9" is not a positive decimal number"#)),
            ("EUR", "EUR=1,EUR=2", Err("EUR has two maximum amounts")),
            ("EUR", "EUR:1", Err(r#"maximum amount "EUR:1" is not a positive decimal number"#)),
            ("EUR", "EUR=1,USD", Err(r#""USD" is not CURRENCY=AMOUNT"#)),
        ];
        for &(currencies, max, expected) in table {
            assert_eq!(rules(currencies, max).map(|_| ()), expected.map_err(str::to_owned), "{currencies} / {max}");
        }
    }

    #[test]
    fn checks() {
        let rules = rules("EUR,JPY,KWD", "EUR=10000,JPY=1500000,KWD=3000").unwrap();
        let d = |s: &str| s.parse::<Decimal>().unwrap();
        let c = |s: &str| Some(s.parse::<Currency>().unwrap());
        let table: &[CheckCase<'_>] = &[
            ("120.5", None, Ok(("120.50", "EUR"))),
            ("120.5", c("EUR"), Ok(("120.50", "EUR"))),
            ("120", None, Ok(("120.00", "EUR"))),
            ("10000", None, Ok(("10000.00", "EUR"))),
            ("10000.01", None, Err("total_amount 10000.01 EUR is above the maximum charge of 10000 EUR: not charged")),
            ("1000000000", None, Err("total_amount 1000000000.00 EUR is above the maximum charge of 10000 EUR: not charged")),
            ("1.005", None, Err("total_amount 1.005 has more decimal places than EUR has (2)")),
            ("1200", c("JPY"), Ok(("1200", "JPY"))),
            ("1200.00", c("JPY"), Ok(("1200", "JPY"))),
            ("1200.5", c("JPY"), Err("total_amount 1200.5 has more decimal places than JPY has (0)")),
            ("1.005", c("KWD"), Ok(("1.005", "KWD"))),
            ("5", c("USD"), Err("currency USD is not accepted (accepted: EUR, JPY, KWD)")),
            ("79228162514264337593543950335", c("JPY"), Err("total_amount 79228162514264337593543950335 JPY is above the maximum charge of 1500000 JPY: not charged")),
        ];
        for &(amount, currency, expected) in table {
            let got = rules.check(d(amount), currency).map_err(|e| e.to_string());
            let expected = expected.map(|(a, c)| Money { amount: a.to_owned(), currency: c.parse().unwrap() });
            assert_eq!(got, expected.map_err(str::to_owned), "{amount} {currency:?}");
        }
    }

    #[test]
    fn formats_keep_every_digit_of_the_largest_amounts() {
        assert_eq!(Currency::EUR.format(Decimal::MAX).as_deref(), Some("79228162514264337593543950335.00"));
        assert_eq!(Currency::EUR.format(Decimal::new(1, 2)).as_deref(), Some("0.01"));
    }
}
