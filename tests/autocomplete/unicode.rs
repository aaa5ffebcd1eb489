//! Unicode.

use super::*;

/// Case folding (full: ß = ss), normalization (composed = decomposed, compatibility forms), in
/// Latin with diacritics, Cyrillic, Greek, CJK and emoji; results keep their display form.
#[tokio::test]
async fn unicode_matching_in_several_scripts() {
    let (_redis, _baton, mut client) = setup().await;
    let reader = client.clone();
    let d = "unicode";
    let decomposed = "Rene\u{301}e Dubois"; // "Renée" with a combining acute accent
    add_all(
        &mut client,
        d,
        &[
            "Straße",
            "Müller",
            decomposed,
            "Zoë Ólafsdóttir",
            "Łódź",
            "Иван Петров",
            "ПЕТЯ",
            "Οδυσσέας Ελύτης",
            "ΣΟΦΙΑ",
            "王伟",
            "张伟明",
            "佐藤太郎",
            "𠮷野家",
            "🎸 Guitar Shop",
            "Rock 🎸",
            "ＡＢＣ Corp",
            "ﬁle",
            "İstanbul Havalimanı",
            "Diyarbakır",
        ],
    )
    .await;
    let c = |q: &str, mode: Mode| {
        let mut client = reader.clone();
        let q = q.to_owned();
        async move { complete(&mut client, d, &q, mode, Order::Lexicographic, 10).await }
    };
    // Full case folding.
    assert_eq!(c("STRASSE", Mode::Prefix).await, ["Straße"]);
    assert_eq!(c("strass", Mode::Prefix).await, ["Straße"]);
    assert_eq!(c("STRAẞE", Mode::Prefix).await, ["Straße"]);
    // Composed query, decomposed term (and back): the display keeps its original form.
    assert_eq!(c("Ren\u{e9}e", Mode::Prefix).await, [decomposed]);
    assert_eq!(c("RENE\u{301}E", Mode::Prefix).await, [decomposed]);
    assert_eq!(c("zoe\u{308}", Mode::Prefix).await, ["Zoë Ólafsdóttir"]);
    assert_eq!(c("ÓLAFS", Mode::WordPrefix).await, ["Zoë Ólafsdóttir"]);
    assert_eq!(c("MÜL", Mode::Prefix).await, ["Müller"]);
    assert_eq!(c("łó", Mode::Prefix).await, ["Łódź"]);
    // No accent folding: "zoe" is not "zoë".
    assert!(c("zoe", Mode::Prefix).await.is_empty());
    // Cyrillic and Greek, with final sigma.
    assert_eq!(c("иван", Mode::Prefix).await, ["Иван Петров"]);
    assert_eq!(c("ПЕТР", Mode::WordPrefix).await, ["Иван Петров"]);
    assert_eq!(c("петя", Mode::Prefix).await, ["ПЕТЯ"]);
    assert_eq!(c("ΟΔΥΣΣΈΑΣ", Mode::Prefix).await, ["Οδυσσέας Ελύτης"]);
    assert_eq!(c("σοφια", Mode::Prefix).await, ["ΣΟΦΙΑ"]);
    assert_eq!(c("ύτης", Mode::Suffix).await, ["Οδυσσέας Ελύτης"]);
    // CJK, including a character outside the Basic Multilingual Plane.
    assert_eq!(c("伟", Mode::Contains).await, ["张伟明", "王伟"]);
    assert_eq!(c("张", Mode::Prefix).await, ["张伟明"]);
    assert_eq!(c("太郎", Mode::Suffix).await, ["佐藤太郎"]);
    assert_eq!(c("𠮷", Mode::Prefix).await, ["𠮷野家"]);
    assert_eq!(c("野", Mode::Contains).await, ["𠮷野家"]);
    // Emoji.
    assert_eq!(c("🎸", Mode::Prefix).await, ["🎸 Guitar Shop"]);
    assert_eq!(c("🎸", Mode::Contains).await, ["Rock 🎸", "🎸 Guitar Shop"]);
    assert_eq!(c("guitar", Mode::WordPrefix).await, ["🎸 Guitar Shop"]);
    // Compatibility forms.
    assert_eq!(c("abc", Mode::Prefix).await, ["ＡＢＣ Corp"]);
    assert_eq!(c("FILE", Mode::Prefix).await, ["ﬁle"]);
    // Turkish dotted capital I: its dot above goes, so plain and capital queries find it (in
    // every mode); the dotless ı stays a letter of its own.
    for q in ["istanbul", "ISTANBUL", "İst", "i\u{307}st"] {
        assert_eq!(c(q, Mode::Prefix).await, ["İstanbul Havalimanı"], "{q}");
    }
    assert_eq!(c("STANB", Mode::Contains).await, ["İstanbul Havalimanı"]);
    assert_eq!(
        c("havalimanı", Mode::WordPrefix).await,
        ["İstanbul Havalimanı"]
    );
    assert!(c("havalimani", Mode::WordPrefix).await.is_empty());
    assert_eq!(c("diyarbakır", Mode::Prefix).await, ["Diyarbakır"]);
    assert!(c("DIYARBAKIR", Mode::Prefix).await.is_empty());
    // Removing by either normalization form of the display.
    let r = remove(&mut client, d, &["Ren\u{e9}e Dubois"]).await;
    assert_eq!(r.removed, 1);
    assert!(c("renee", Mode::Prefix).await.is_empty());
}
