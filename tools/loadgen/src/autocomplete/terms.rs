//! The seeded dictionary: realistic names (Latin with diacritics, Cyrillic, Greek, CJK with
//! characters outside the BMP, product names with emoji), the same for the same seed anywhere.

use std::collections::HashSet;

/// One generated term.
#[derive(Debug, Clone)]
pub struct GeneratedTerm {
    /// Its display text.
    pub display: String,
    /// Its score (popularity).
    pub score: f64,
    /// Its payload, for half of them.
    pub payload: Option<Vec<u8>>,
}

/// SplitMix64: small, seeded, reproducible everywhere.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn pick<'a>(&mut self, list: &[&'a str]) -> &'a str {
        list[self.below(list.len())]
    }
}

const FIRST: &[&str] = &[
    "Anna",
    "Aaron",
    "Adam",
    "Adèle",
    "Agnieszka",
    "Ahmed",
    "Aiko",
    "Alba",
    "Alejandro",
    "Aleksandr",
    "Alice",
    "Amélie",
    "Ana",
    "Andrés",
    "Andrzej",
    "Ángel",
    "Anja",
    "Antoine",
    "Antonio",
    "Arjun",
    "Ayşe",
    "Beatriz",
    "Benjamin",
    "Björn",
    "Bob",
    "Bruno",
    "Camille",
    "Carlos",
    "Chen",
    "Chloé",
    "Clara",
    "Cristina",
    "Daniel",
    "Dávid",
    "Diego",
    "Dmitri",
    "Élodie",
    "Elena",
    "Eliška",
    "Emma",
    "Emre",
    "Érica",
    "Eva",
    "Fatima",
    "Felix",
    "Fernando",
    "François",
    "Frida",
    "Gabriel",
    "Giulia",
    "Grégoire",
    "Hana",
    "Hannah",
    "Héctor",
    "Helga",
    "Hiroshi",
    "Ingrid",
    "Isabel",
    "Ivan",
    "Jakub",
    "James",
    "Jan",
    "Javier",
    "Jean",
    "Jörg",
    "José",
    "Juan",
    "Julia",
    "Jürgen",
    "Karin",
    "Kenji",
    "Laura",
    "Léa",
    "Lena",
    "Liam",
    "Lucía",
    "Łukasz",
    "Magnus",
    "Małgorzata",
    "María",
    "Marco",
    "Margrét",
    "Mateo",
    "Mehmet",
    "Mia",
    "Miguel",
    "Mikko",
    "Noah",
    "Noémie",
    "Olga",
    "Oliver",
    "Óscar",
    "Paula",
    "Pedro",
    "Pierre",
    "Priya",
    "Rafael",
    "Ramón",
    "Renée",
    "Rocío",
    "Rui",
    "Sakura",
    "Sara",
    "Sebastián",
    "Siobhán",
    "Sofía",
    "Søren",
    "Stefan",
    "Sven",
    "Tomás",
    "Umut",
    "Valentina",
    "Víctor",
    "Wei",
    "Yuki",
    "Zoë",
    "Žofia",
    "Иван",
    "Ольга",
    "Дмитрий",
    "Наталья",
    "Сергей",
    "Анна",
    "Γιώργος",
    "Μαρία",
    "Νίκος",
    "Ελένη",
    "Δημήτρης",
    "Σοφία",
];

const LAST: &[&str] = &[
    "Smith",
    "Johnson",
    "Müller",
    "Schmidt",
    "García",
    "Martínez",
    "López",
    "González",
    "Rodríguez",
    "Fernández",
    "Pérez",
    "Sánchez",
    "Dubois",
    "Lefèvre",
    "Moreau",
    "Rossi",
    "Bianchi",
    "Ferrari",
    "Nowak",
    "Kowalski",
    "Wiśniewski",
    "Novák",
    "Dvořák",
    "Svoboda",
    "Jensen",
    "Nielsen",
    "Hansen",
    "Andersson",
    "Johansson",
    "Ólafsdóttir",
    "Jónsson",
    "Kovačević",
    "Horváth",
    "Nagy",
    "Yılmaz",
    "Kaya",
    "Öztürk",
    "Sato",
    "Suzuki",
    "Takahashi",
    "Tanaka",
    "Kim",
    "Lee",
    "Park",
    "Nguyễn",
    "Trần",
    "Patel",
    "Sharma",
    "Singh",
    "O'Brien",
    "O'Connor",
    "MacDonald",
    "Fitzgerald",
    "Brown",
    "Taylor",
    "Wilson",
    "Anderson",
    "Thomas",
    "Moore",
    "Martin",
    "Jackson",
    "Thompson",
    "White",
    "Harris",
    "Clark",
    "Lewis",
    "Robinson",
    "Walker",
    "Young",
    "Allen",
    "King",
    "Wright",
    "Scott",
    "Hill",
    "Green",
    "Adams",
    "Baker",
    "Nelson",
    "Carter",
    "Mitchell",
    "Roberts",
    "Turner",
    "Phillips",
    "Campbell",
    "Parker",
    "Evans",
    "Edwards",
    "Collins",
    "Stewart",
    "Morris",
    "Rogers",
    "Reed",
    "Cook",
    "Morgan",
    "Bell",
    "Murphy",
    "Bailey",
    "Cooper",
    "Richardson",
    "Cox",
    "Howard",
    "Ward",
    "Torres",
    "Peterson",
    "Gray",
    "Ramírez",
    "James",
    "Watson",
    "Brooks",
    "Kelly",
    "Sanders",
    "Price",
    "Bennett",
    "Wood",
    "Barnes",
    "Ross",
    "Henderson",
    "Coleman",
    "Jenkins",
    "Straße",
    "Weiß",
    "Groß",
    "Иванов",
    "Петрова",
    "Смирнов",
    "Кузнецова",
    "Παπαδόπουλος",
    "Οικονόμου",
    "Γεωργίου",
    "Καραγιάννης",
];

const CJK_SURNAMES: &[&str] = &[
    "王", "李", "张", "刘", "陈", "杨", "黄", "赵", "吴", "周", "徐", "孙", "马", "朱", "胡", "郭",
    "何", "高", "林", "罗", "佐藤", "鈴木", "高橋", "田中", "渡辺", "김", "이", "박", "최", "정",
];
const CJK_GIVEN: &[&str] = &[
    "伟", "芳", "娜", "敏", "静", "丽", "强", "磊", "军", "洋", "勇", "艳", "杰", "娟", "涛", "明",
    "超", "秀", "霞", "平", "刚", "桂", "英", "华", "玉", "萍", "红", "鹏", "辉", "琳", "𠮷", "𡈽",
    "太郎", "花子", "翔", "陽菜", "민준", "서연", "지호", "하은",
];

const BRANDS: &[&str] = &[
    "Acme",
    "Globex",
    "Initech",
    "Umbrella",
    "Stark",
    "Wayne",
    "Hooli",
    "Vandelay",
    "Soylent",
    "Zürich",
    "Ñandú",
    "Kōbō",
    "Škoda",
    "Łódź",
    "Café Noir",
    "Crème",
    "Smörgås",
    "Fjällräven",
];
const PRODUCTS: &[&str] = &[
    "Blender",
    "Toaster",
    "Kettle",
    "Headphones",
    "Speaker",
    "Guitar",
    "Backpack",
    "Sneakers",
    "Espresso Machine",
    "Desk Lamp",
    "Office Chair",
    "Monitor",
    "Keyboard",
    "Mouse",
    "Router",
    "Camera",
    "Tripod",
    "Drone",
    "Scooter",
    "Bicycle",
    "Tent",
    "Sleeping Bag",
    "Jacket",
];
const EMOJI: &[&str] = &[
    "🎸", "🚲", "☕", "🎧", "📷", "⛺", "🍕", "🚀", "🌍", "❤️", "👍", "🐈",
];

/// `n` distinct terms, the same for the same seed: people (Latin with diacritics, Cyrillic,
/// Greek), CJK names, and product names, some with emoji.
pub fn generate(n: usize, seed: u64) -> Vec<GeneratedTerm> {
    let mut rng = Rng(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let roll = rng.below(100);
        let display = if roll < 70 {
            let mut s = rng.pick(FIRST).to_owned();
            if rng.below(100) < 40 {
                s.push(' ');
                s.push(char::from(b'A' + rng.below(26) as u8));
                s.push('.');
            }
            s.push(' ');
            s.push_str(rng.pick(LAST));
            if rng.below(100) < 35 {
                s.push(if rng.below(2) == 0 { ' ' } else { '-' });
                s.push_str(rng.pick(LAST));
            }
            s
        } else if roll < 82 {
            let mut s = rng.pick(CJK_SURNAMES).to_owned();
            s.push_str(rng.pick(CJK_GIVEN));
            if rng.below(2) == 0 {
                s.push_str(rng.pick(CJK_GIVEN));
            }
            if rng.below(100) < 30 {
                s.push_str(&format!(" {}", rng.below(1000)));
            }
            s
        } else {
            let mut s = String::new();
            if rng.below(100) < 25 {
                s.push_str(rng.pick(EMOJI));
                s.push(' ');
            }
            s.push_str(rng.pick(BRANDS));
            s.push(' ');
            s.push_str(rng.pick(PRODUCTS));
            s.push_str(&format!(
                " {}{}",
                char::from(b'A' + rng.below(26) as u8),
                rng.below(10_000)
            ));
            s
        };
        if seen.insert(display.clone()) {
            let score = (rng.below(1_000_000) as f64).powf(0.5).floor();
            let payload = (rng.below(2) == 0).then(|| format!("id:{}", out.len()).into_bytes());
            out.push(GeneratedTerm {
                display,
                score,
                payload,
            });
        }
    }
    out
}
