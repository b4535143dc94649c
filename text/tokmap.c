/* text/tokmap.c — the engram's compressed token map of DeepSeek-V4.1: each
 * id's text normalized as Hugging Face tokenizers' normalizers do it (their
 * Unicode tables included), classes numbered in first-seen id order. */
#include "tokmap.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "buf.h"
#include "hmap.h"
#include "log.h"

/* ---- Unicode tables --------------------------------------------------------
 *
 * tokenizers' NFKC, NFD and StripAccents come from the
 * unicode-normalization-alignments crate, whose tables are an old Unicode
 * version: a code point assigned later is, for them, unassigned (no
 * decomposition, combining class 0, no composition, not a mark). Its Lowercase
 * is Rust's char::to_lowercase, whose tables are newer than utf8proc's. The
 * tables below say where they differ from utf8proc; tests/tokmap/mkucd asks
 * tokenizers itself and rewrites them. */

/* BEGIN tests/tokmap/mkucd */
/* Made by tests/tokmap/mkucd from tokenizers 0.23.3, Perl's Unicode::UCD and
 * utf8proc 2.8.0 (Unicode 15.0.0). */

/* The Unicode version of tokenizers' NFKC, NFD and StripAccents tables. */
#define TOKMAP_HF_NORM_UNICODE "9.0"

/* Code points assigned in that version, as inclusive ranges (648). */
static const uint32_t tokmap_known_ranges[][2] = {
    {0x0, 0x377}, {0x37A, 0x37F}, {0x384, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x52F}, {0x531, 0x556}, {0x559, 0x55F},
    {0x561, 0x587}, {0x589, 0x58A}, {0x58D, 0x58F}, {0x591, 0x5C7},
    {0x5D0, 0x5EA}, {0x5F0, 0x5F4}, {0x600, 0x61C}, {0x61E, 0x70D},
    {0x70F, 0x74A}, {0x74D, 0x7B1}, {0x7C0, 0x7FA}, {0x800, 0x82D},
    {0x830, 0x83E}, {0x840, 0x85B}, {0x85E, 0x85E}, {0x8A0, 0x8B4},
    {0x8B6, 0x8BD}, {0x8D4, 0x983}, {0x985, 0x98C}, {0x98F, 0x990},
    {0x993, 0x9A8}, {0x9AA, 0x9B0}, {0x9B2, 0x9B2}, {0x9B6, 0x9B9},
    {0x9BC, 0x9C4}, {0x9C7, 0x9C8}, {0x9CB, 0x9CE}, {0x9D7, 0x9D7},
    {0x9DC, 0x9DD}, {0x9DF, 0x9E3}, {0x9E6, 0x9FB}, {0xA01, 0xA03},
    {0xA05, 0xA0A}, {0xA0F, 0xA10}, {0xA13, 0xA28}, {0xA2A, 0xA30},
    {0xA32, 0xA33}, {0xA35, 0xA36}, {0xA38, 0xA39}, {0xA3C, 0xA3C},
    {0xA3E, 0xA42}, {0xA47, 0xA48}, {0xA4B, 0xA4D}, {0xA51, 0xA51},
    {0xA59, 0xA5C}, {0xA5E, 0xA5E}, {0xA66, 0xA75}, {0xA81, 0xA83},
    {0xA85, 0xA8D}, {0xA8F, 0xA91}, {0xA93, 0xAA8}, {0xAAA, 0xAB0},
    {0xAB2, 0xAB3}, {0xAB5, 0xAB9}, {0xABC, 0xAC5}, {0xAC7, 0xAC9},
    {0xACB, 0xACD}, {0xAD0, 0xAD0}, {0xAE0, 0xAE3}, {0xAE6, 0xAF1},
    {0xAF9, 0xAF9}, {0xB01, 0xB03}, {0xB05, 0xB0C}, {0xB0F, 0xB10},
    {0xB13, 0xB28}, {0xB2A, 0xB30}, {0xB32, 0xB33}, {0xB35, 0xB39},
    {0xB3C, 0xB44}, {0xB47, 0xB48}, {0xB4B, 0xB4D}, {0xB56, 0xB57},
    {0xB5C, 0xB5D}, {0xB5F, 0xB63}, {0xB66, 0xB77}, {0xB82, 0xB83},
    {0xB85, 0xB8A}, {0xB8E, 0xB90}, {0xB92, 0xB95}, {0xB99, 0xB9A},
    {0xB9C, 0xB9C}, {0xB9E, 0xB9F}, {0xBA3, 0xBA4}, {0xBA8, 0xBAA},
    {0xBAE, 0xBB9}, {0xBBE, 0xBC2}, {0xBC6, 0xBC8}, {0xBCA, 0xBCD},
    {0xBD0, 0xBD0}, {0xBD7, 0xBD7}, {0xBE6, 0xBFA}, {0xC00, 0xC03},
    {0xC05, 0xC0C}, {0xC0E, 0xC10}, {0xC12, 0xC28}, {0xC2A, 0xC39},
    {0xC3D, 0xC44}, {0xC46, 0xC48}, {0xC4A, 0xC4D}, {0xC55, 0xC56},
    {0xC58, 0xC5A}, {0xC60, 0xC63}, {0xC66, 0xC6F}, {0xC78, 0xC83},
    {0xC85, 0xC8C}, {0xC8E, 0xC90}, {0xC92, 0xCA8}, {0xCAA, 0xCB3},
    {0xCB5, 0xCB9}, {0xCBC, 0xCC4}, {0xCC6, 0xCC8}, {0xCCA, 0xCCD},
    {0xCD5, 0xCD6}, {0xCDE, 0xCDE}, {0xCE0, 0xCE3}, {0xCE6, 0xCEF},
    {0xCF1, 0xCF2}, {0xD01, 0xD03}, {0xD05, 0xD0C}, {0xD0E, 0xD10},
    {0xD12, 0xD3A}, {0xD3D, 0xD44}, {0xD46, 0xD48}, {0xD4A, 0xD4F},
    {0xD54, 0xD63}, {0xD66, 0xD7F}, {0xD82, 0xD83}, {0xD85, 0xD96},
    {0xD9A, 0xDB1}, {0xDB3, 0xDBB}, {0xDBD, 0xDBD}, {0xDC0, 0xDC6},
    {0xDCA, 0xDCA}, {0xDCF, 0xDD4}, {0xDD6, 0xDD6}, {0xDD8, 0xDDF},
    {0xDE6, 0xDEF}, {0xDF2, 0xDF4}, {0xE01, 0xE3A}, {0xE3F, 0xE5B},
    {0xE81, 0xE82}, {0xE84, 0xE84}, {0xE87, 0xE88}, {0xE8A, 0xE8A},
    {0xE8D, 0xE8D}, {0xE94, 0xE97}, {0xE99, 0xE9F}, {0xEA1, 0xEA3},
    {0xEA5, 0xEA5}, {0xEA7, 0xEA7}, {0xEAA, 0xEAB}, {0xEAD, 0xEB9},
    {0xEBB, 0xEBD}, {0xEC0, 0xEC4}, {0xEC6, 0xEC6}, {0xEC8, 0xECD},
    {0xED0, 0xED9}, {0xEDC, 0xEDF}, {0xF00, 0xF47}, {0xF49, 0xF6C},
    {0xF71, 0xF97}, {0xF99, 0xFBC}, {0xFBE, 0xFCC}, {0xFCE, 0xFDA},
    {0x1000, 0x10C5}, {0x10C7, 0x10C7}, {0x10CD, 0x10CD}, {0x10D0, 0x1248},
    {0x124A, 0x124D}, {0x1250, 0x1256}, {0x1258, 0x1258}, {0x125A, 0x125D},
    {0x1260, 0x1288}, {0x128A, 0x128D}, {0x1290, 0x12B0}, {0x12B2, 0x12B5},
    {0x12B8, 0x12BE}, {0x12C0, 0x12C0}, {0x12C2, 0x12C5}, {0x12C8, 0x12D6},
    {0x12D8, 0x1310}, {0x1312, 0x1315}, {0x1318, 0x135A}, {0x135D, 0x137C},
    {0x1380, 0x1399}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1400, 0x169C},
    {0x16A0, 0x16F8}, {0x1700, 0x170C}, {0x170E, 0x1714}, {0x1720, 0x1736},
    {0x1740, 0x1753}, {0x1760, 0x176C}, {0x176E, 0x1770}, {0x1772, 0x1773},
    {0x1780, 0x17DD}, {0x17E0, 0x17E9}, {0x17F0, 0x17F9}, {0x1800, 0x180E},
    {0x1810, 0x1819}, {0x1820, 0x1877}, {0x1880, 0x18AA}, {0x18B0, 0x18F5},
    {0x1900, 0x191E}, {0x1920, 0x192B}, {0x1930, 0x193B}, {0x1940, 0x1940},
    {0x1944, 0x196D}, {0x1970, 0x1974}, {0x1980, 0x19AB}, {0x19B0, 0x19C9},
    {0x19D0, 0x19DA}, {0x19DE, 0x1A1B}, {0x1A1E, 0x1A5E}, {0x1A60, 0x1A7C},
    {0x1A7F, 0x1A89}, {0x1A90, 0x1A99}, {0x1AA0, 0x1AAD}, {0x1AB0, 0x1ABE},
    {0x1B00, 0x1B4B}, {0x1B50, 0x1B7C}, {0x1B80, 0x1BF3}, {0x1BFC, 0x1C37},
    {0x1C3B, 0x1C49}, {0x1C4D, 0x1C88}, {0x1CC0, 0x1CC7}, {0x1CD0, 0x1CF6},
    {0x1CF8, 0x1CF9}, {0x1D00, 0x1DF5}, {0x1DFB, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4},
    {0x1FB6, 0x1FC4}, {0x1FC6, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FDD, 0x1FEF},
    {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFE}, {0x2000, 0x2064}, {0x2066, 0x2071},
    {0x2074, 0x208E}, {0x2090, 0x209C}, {0x20A0, 0x20BE}, {0x20D0, 0x20F0},
    {0x2100, 0x218B}, {0x2190, 0x23FE}, {0x2400, 0x2426}, {0x2440, 0x244A},
    {0x2460, 0x2B73}, {0x2B76, 0x2B95}, {0x2B98, 0x2BB9}, {0x2BBD, 0x2BC8},
    {0x2BCA, 0x2BD1}, {0x2BEC, 0x2BEF}, {0x2C00, 0x2C2E}, {0x2C30, 0x2C5E},
    {0x2C60, 0x2CF3}, {0x2CF9, 0x2D25}, {0x2D27, 0x2D27}, {0x2D2D, 0x2D2D},
    {0x2D30, 0x2D67}, {0x2D6F, 0x2D70}, {0x2D7F, 0x2D96}, {0x2DA0, 0x2DA6},
    {0x2DA8, 0x2DAE}, {0x2DB0, 0x2DB6}, {0x2DB8, 0x2DBE}, {0x2DC0, 0x2DC6},
    {0x2DC8, 0x2DCE}, {0x2DD0, 0x2DD6}, {0x2DD8, 0x2DDE}, {0x2DE0, 0x2E44},
    {0x2E80, 0x2E99}, {0x2E9B, 0x2EF3}, {0x2F00, 0x2FD5}, {0x2FF0, 0x2FFB},
    {0x3000, 0x303F}, {0x3041, 0x3096}, {0x3099, 0x30FF}, {0x3105, 0x312D},
    {0x3131, 0x318E}, {0x3190, 0x31BA}, {0x31C0, 0x31E3}, {0x31F0, 0x321E},
    {0x3220, 0x32FE}, {0x3300, 0x4DB5}, {0x4DC0, 0x9FD5}, {0xA000, 0xA48C},
    {0xA490, 0xA4C6}, {0xA4D0, 0xA62B}, {0xA640, 0xA6F7}, {0xA700, 0xA7AE},
    {0xA7B0, 0xA7B7}, {0xA7F7, 0xA82B}, {0xA830, 0xA839}, {0xA840, 0xA877},
    {0xA880, 0xA8C5}, {0xA8CE, 0xA8D9}, {0xA8E0, 0xA8FD}, {0xA900, 0xA953},
    {0xA95F, 0xA97C}, {0xA980, 0xA9CD}, {0xA9CF, 0xA9D9}, {0xA9DE, 0xA9FE},
    {0xAA00, 0xAA36}, {0xAA40, 0xAA4D}, {0xAA50, 0xAA59}, {0xAA5C, 0xAAC2},
    {0xAADB, 0xAAF6}, {0xAB01, 0xAB06}, {0xAB09, 0xAB0E}, {0xAB11, 0xAB16},
    {0xAB20, 0xAB26}, {0xAB28, 0xAB2E}, {0xAB30, 0xAB65}, {0xAB70, 0xABED},
    {0xABF0, 0xABF9}, {0xAC00, 0xD7A3}, {0xD7B0, 0xD7C6}, {0xD7CB, 0xD7FB},
    {0xD800, 0xFA6D}, {0xFA70, 0xFAD9}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
    {0xFB1D, 0xFB36}, {0xFB38, 0xFB3C}, {0xFB3E, 0xFB3E}, {0xFB40, 0xFB41},
    {0xFB43, 0xFB44}, {0xFB46, 0xFBC1}, {0xFBD3, 0xFD3F}, {0xFD50, 0xFD8F},
    {0xFD92, 0xFDC7}, {0xFDD0, 0xFDFD}, {0xFE00, 0xFE19}, {0xFE20, 0xFE52},
    {0xFE54, 0xFE66}, {0xFE68, 0xFE6B}, {0xFE70, 0xFE74}, {0xFE76, 0xFEFC},
    {0xFEFF, 0xFEFF}, {0xFF01, 0xFFBE}, {0xFFC2, 0xFFC7}, {0xFFCA, 0xFFCF},
    {0xFFD2, 0xFFD7}, {0xFFDA, 0xFFDC}, {0xFFE0, 0xFFE6}, {0xFFE8, 0xFFEE},
    {0xFFF9, 0x1000B}, {0x1000D, 0x10026}, {0x10028, 0x1003A}, {0x1003C, 0x1003D},
    {0x1003F, 0x1004D}, {0x10050, 0x1005D}, {0x10080, 0x100FA}, {0x10100, 0x10102},
    {0x10107, 0x10133}, {0x10137, 0x1018E}, {0x10190, 0x1019B}, {0x101A0, 0x101A0},
    {0x101D0, 0x101FD}, {0x10280, 0x1029C}, {0x102A0, 0x102D0}, {0x102E0, 0x102FB},
    {0x10300, 0x10323}, {0x10330, 0x1034A}, {0x10350, 0x1037A}, {0x10380, 0x1039D},
    {0x1039F, 0x103C3}, {0x103C8, 0x103D5}, {0x10400, 0x1049D}, {0x104A0, 0x104A9},
    {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10500, 0x10527}, {0x10530, 0x10563},
    {0x1056F, 0x1056F}, {0x10600, 0x10736}, {0x10740, 0x10755}, {0x10760, 0x10767},
    {0x10800, 0x10805}, {0x10808, 0x10808}, {0x1080A, 0x10835}, {0x10837, 0x10838},
    {0x1083C, 0x1083C}, {0x1083F, 0x10855}, {0x10857, 0x1089E}, {0x108A7, 0x108AF},
    {0x108E0, 0x108F2}, {0x108F4, 0x108F5}, {0x108FB, 0x1091B}, {0x1091F, 0x10939},
    {0x1093F, 0x1093F}, {0x10980, 0x109B7}, {0x109BC, 0x109CF}, {0x109D2, 0x10A03},
    {0x10A05, 0x10A06}, {0x10A0C, 0x10A13}, {0x10A15, 0x10A17}, {0x10A19, 0x10A33},
    {0x10A38, 0x10A3A}, {0x10A3F, 0x10A47}, {0x10A50, 0x10A58}, {0x10A60, 0x10A9F},
    {0x10AC0, 0x10AE6}, {0x10AEB, 0x10AF6}, {0x10B00, 0x10B35}, {0x10B39, 0x10B55},
    {0x10B58, 0x10B72}, {0x10B78, 0x10B91}, {0x10B99, 0x10B9C}, {0x10BA9, 0x10BAF},
    {0x10C00, 0x10C48}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x10CFA, 0x10CFF},
    {0x10E60, 0x10E7E}, {0x11000, 0x1104D}, {0x11052, 0x1106F}, {0x1107F, 0x110C1},
    {0x110D0, 0x110E8}, {0x110F0, 0x110F9}, {0x11100, 0x11134}, {0x11136, 0x11143},
    {0x11150, 0x11176}, {0x11180, 0x111CD}, {0x111D0, 0x111DF}, {0x111E1, 0x111F4},
    {0x11200, 0x11211}, {0x11213, 0x1123E}, {0x11280, 0x11286}, {0x11288, 0x11288},
    {0x1128A, 0x1128D}, {0x1128F, 0x1129D}, {0x1129F, 0x112A9}, {0x112B0, 0x112EA},
    {0x112F0, 0x112F9}, {0x11300, 0x11303}, {0x11305, 0x1130C}, {0x1130F, 0x11310},
    {0x11313, 0x11328}, {0x1132A, 0x11330}, {0x11332, 0x11333}, {0x11335, 0x11339},
    {0x1133C, 0x11344}, {0x11347, 0x11348}, {0x1134B, 0x1134D}, {0x11350, 0x11350},
    {0x11357, 0x11357}, {0x1135D, 0x11363}, {0x11366, 0x1136C}, {0x11370, 0x11374},
    {0x11400, 0x11459}, {0x1145B, 0x1145B}, {0x1145D, 0x1145D}, {0x11480, 0x114C7},
    {0x114D0, 0x114D9}, {0x11580, 0x115B5}, {0x115B8, 0x115DD}, {0x11600, 0x11644},
    {0x11650, 0x11659}, {0x11660, 0x1166C}, {0x11680, 0x116B7}, {0x116C0, 0x116C9},
    {0x11700, 0x11719}, {0x1171D, 0x1172B}, {0x11730, 0x1173F}, {0x118A0, 0x118F2},
    {0x118FF, 0x118FF}, {0x11AC0, 0x11AF8}, {0x11C00, 0x11C08}, {0x11C0A, 0x11C36},
    {0x11C38, 0x11C45}, {0x11C50, 0x11C6C}, {0x11C70, 0x11C8F}, {0x11C92, 0x11CA7},
    {0x11CA9, 0x11CB6}, {0x12000, 0x12399}, {0x12400, 0x1246E}, {0x12470, 0x12474},
    {0x12480, 0x12543}, {0x13000, 0x1342E}, {0x14400, 0x14646}, {0x16800, 0x16A38},
    {0x16A40, 0x16A5E}, {0x16A60, 0x16A69}, {0x16A6E, 0x16A6F}, {0x16AD0, 0x16AED},
    {0x16AF0, 0x16AF5}, {0x16B00, 0x16B45}, {0x16B50, 0x16B59}, {0x16B5B, 0x16B61},
    {0x16B63, 0x16B77}, {0x16B7D, 0x16B8F}, {0x16F00, 0x16F44}, {0x16F50, 0x16F7E},
    {0x16F8F, 0x16F9F}, {0x16FE0, 0x16FE0}, {0x17000, 0x187EC}, {0x18800, 0x18AF2},
    {0x1B000, 0x1B001}, {0x1BC00, 0x1BC6A}, {0x1BC70, 0x1BC7C}, {0x1BC80, 0x1BC88},
    {0x1BC90, 0x1BC99}, {0x1BC9C, 0x1BCA3}, {0x1D000, 0x1D0F5}, {0x1D100, 0x1D126},
    {0x1D129, 0x1D1E8}, {0x1D200, 0x1D245}, {0x1D300, 0x1D356}, {0x1D360, 0x1D371},
    {0x1D400, 0x1D454}, {0x1D456, 0x1D49C}, {0x1D49E, 0x1D49F}, {0x1D4A2, 0x1D4A2},
    {0x1D4A5, 0x1D4A6}, {0x1D4A9, 0x1D4AC}, {0x1D4AE, 0x1D4B9}, {0x1D4BB, 0x1D4BB},
    {0x1D4BD, 0x1D4C3}, {0x1D4C5, 0x1D505}, {0x1D507, 0x1D50A}, {0x1D50D, 0x1D514},
    {0x1D516, 0x1D51C}, {0x1D51E, 0x1D539}, {0x1D53B, 0x1D53E}, {0x1D540, 0x1D544},
    {0x1D546, 0x1D546}, {0x1D54A, 0x1D550}, {0x1D552, 0x1D6A5}, {0x1D6A8, 0x1D7CB},
    {0x1D7CE, 0x1DA8B}, {0x1DA9B, 0x1DA9F}, {0x1DAA1, 0x1DAAF}, {0x1E000, 0x1E006},
    {0x1E008, 0x1E018}, {0x1E01B, 0x1E021}, {0x1E023, 0x1E024}, {0x1E026, 0x1E02A},
    {0x1E800, 0x1E8C4}, {0x1E8C7, 0x1E8D6}, {0x1E900, 0x1E94A}, {0x1E950, 0x1E959},
    {0x1E95E, 0x1E95F}, {0x1EE00, 0x1EE03}, {0x1EE05, 0x1EE1F}, {0x1EE21, 0x1EE22},
    {0x1EE24, 0x1EE24}, {0x1EE27, 0x1EE27}, {0x1EE29, 0x1EE32}, {0x1EE34, 0x1EE37},
    {0x1EE39, 0x1EE39}, {0x1EE3B, 0x1EE3B}, {0x1EE42, 0x1EE42}, {0x1EE47, 0x1EE47},
    {0x1EE49, 0x1EE49}, {0x1EE4B, 0x1EE4B}, {0x1EE4D, 0x1EE4F}, {0x1EE51, 0x1EE52},
    {0x1EE54, 0x1EE54}, {0x1EE57, 0x1EE57}, {0x1EE59, 0x1EE59}, {0x1EE5B, 0x1EE5B},
    {0x1EE5D, 0x1EE5D}, {0x1EE5F, 0x1EE5F}, {0x1EE61, 0x1EE62}, {0x1EE64, 0x1EE64},
    {0x1EE67, 0x1EE6A}, {0x1EE6C, 0x1EE72}, {0x1EE74, 0x1EE77}, {0x1EE79, 0x1EE7C},
    {0x1EE7E, 0x1EE7E}, {0x1EE80, 0x1EE89}, {0x1EE8B, 0x1EE9B}, {0x1EEA1, 0x1EEA3},
    {0x1EEA5, 0x1EEA9}, {0x1EEAB, 0x1EEBB}, {0x1EEF0, 0x1EEF1}, {0x1F000, 0x1F02B},
    {0x1F030, 0x1F093}, {0x1F0A0, 0x1F0AE}, {0x1F0B1, 0x1F0BF}, {0x1F0C1, 0x1F0CF},
    {0x1F0D1, 0x1F0F5}, {0x1F100, 0x1F10C}, {0x1F110, 0x1F12E}, {0x1F130, 0x1F16B},
    {0x1F170, 0x1F1AC}, {0x1F1E6, 0x1F202}, {0x1F210, 0x1F23B}, {0x1F240, 0x1F248},
    {0x1F250, 0x1F251}, {0x1F300, 0x1F6D2}, {0x1F6E0, 0x1F6EC}, {0x1F6F0, 0x1F6F6},
    {0x1F700, 0x1F773}, {0x1F780, 0x1F7D4}, {0x1F800, 0x1F80B}, {0x1F810, 0x1F847},
    {0x1F850, 0x1F859}, {0x1F860, 0x1F887}, {0x1F890, 0x1F8AD}, {0x1F910, 0x1F91E},
    {0x1F920, 0x1F927}, {0x1F930, 0x1F930}, {0x1F933, 0x1F93E}, {0x1F940, 0x1F94B},
    {0x1F950, 0x1F95E}, {0x1F980, 0x1F991}, {0x1F9C0, 0x1F9C0}, {0x1FFFE, 0x2A6D6},
    {0x2A700, 0x2B734}, {0x2B740, 0x2B81D}, {0x2B820, 0x2CEA1}, {0x2F800, 0x2FA1D},
    {0x2FFFE, 0x2FFFF}, {0x3FFFE, 0x3FFFF}, {0x4FFFE, 0x4FFFF}, {0x5FFFE, 0x5FFFF},
    {0x6FFFE, 0x6FFFF}, {0x7FFFE, 0x7FFFF}, {0x8FFFE, 0x8FFFF}, {0x9FFFE, 0x9FFFF},
    {0xAFFFE, 0xAFFFF}, {0xBFFFE, 0xBFFFF}, {0xCFFFE, 0xCFFFF}, {0xDFFFE, 0xDFFFF},
    {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xE0100, 0xE01EF}, {0xEFFFE, 0x10FFFF},
};

/* Code points assigned then whose mark-ness (General_Category M*) utf8proc
 * reads otherwise: 1 = a mark for tokenizers, 0 = not (category now). */
static const struct { uint32_t cp; uint8_t mark; } tokmap_mark_flip[] = {
    {0x1CF2, 1}, /* now Lo */
    {0x1CF3, 1}, /* now Lo */
    {0x111C9, 0}, /* now Mn */
};

/* One-code-point lower cases of Rust's char::to_lowercase that utf8proc_tolower
 * does not give (case pairs newer than utf8proc's Unicode). */
static const uint32_t tokmap_lower[][2] = {
    {0x1C89, 0x1C8A}, {0xA7CB, 0x0264}, {0xA7CC, 0xA7CD}, {0xA7CE, 0xA7CF},
    {0xA7D2, 0xA7D3}, {0xA7D4, 0xA7D5}, {0xA7DA, 0xA7DB}, {0xA7DC, 0x019B},
    {0x10D50, 0x10D70}, {0x10D51, 0x10D71}, {0x10D52, 0x10D72}, {0x10D53, 0x10D73},
    {0x10D54, 0x10D74}, {0x10D55, 0x10D75}, {0x10D56, 0x10D76}, {0x10D57, 0x10D77},
    {0x10D58, 0x10D78}, {0x10D59, 0x10D79}, {0x10D5A, 0x10D7A}, {0x10D5B, 0x10D7B},
    {0x10D5C, 0x10D7C}, {0x10D5D, 0x10D7D}, {0x10D5E, 0x10D7E}, {0x10D5F, 0x10D7F},
    {0x10D60, 0x10D80}, {0x10D61, 0x10D81}, {0x10D62, 0x10D82}, {0x10D63, 0x10D83},
    {0x10D64, 0x10D84}, {0x10D65, 0x10D85}, {0x16EA0, 0x16EBB}, {0x16EA1, 0x16EBC},
    {0x16EA2, 0x16EBD}, {0x16EA3, 0x16EBE}, {0x16EA4, 0x16EBF}, {0x16EA5, 0x16EC0},
    {0x16EA6, 0x16EC1}, {0x16EA7, 0x16EC2}, {0x16EA8, 0x16EC3}, {0x16EA9, 0x16EC4},
    {0x16EAA, 0x16EC5}, {0x16EAB, 0x16EC6}, {0x16EAC, 0x16EC7}, {0x16EAD, 0x16EC8},
    {0x16EAE, 0x16EC9}, {0x16EAF, 0x16ECA}, {0x16EB0, 0x16ECB}, {0x16EB1, 0x16ECC},
    {0x16EB2, 0x16ECD}, {0x16EB3, 0x16ECE}, {0x16EB4, 0x16ECF}, {0x16EB5, 0x16ED0},
    {0x16EB6, 0x16ED1}, {0x16EB7, 0x16ED2}, {0x16EB8, 0x16ED3},
};
/* END tests/tokmap/mkucd */

#define TOKMAP_SENTINEL 0xE000u  /* private use: keeps a lone space through Strip */
#define TOKMAP_FFFD     0xFFFDu

/* Assigned in TOKMAP_HF_NORM_UNICODE, so known to tokenizers' normalization. */
static bool
tokmap_known(int32_t c)
{
    size_t lo = 0, hi = sizeof(tokmap_known_ranges) / sizeof(tokmap_known_ranges[0]);

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uint32_t)c < tokmap_known_ranges[mid][0])
            hi = mid;
        else if ((uint32_t)c > tokmap_known_ranges[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* What StripAccents removes: a mark (General_Category M*) of its Unicode. */
static bool
tokmap_is_mark(int32_t c)
{
    if (c < 0x300 || !tokmap_known(c))
        return false;
    for (size_t i = 0; i < sizeof(tokmap_mark_flip) / sizeof(tokmap_mark_flip[0]); i++)
        if (tokmap_mark_flip[i].cp == (uint32_t)c)
            return tokmap_mark_flip[i].mark;
    utf8proc_category_t cat = utf8proc_category(c);
    return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
           cat == UTF8PROC_CATEGORY_ME;
}

/* Rust's char::to_lowercase of one code point when it is one code point. */
static int32_t
tokmap_lower1(int32_t c)
{
    size_t lo = 0, hi = sizeof(tokmap_lower) / sizeof(tokmap_lower[0]);

    if (c < 0x80)
        return c >= 'A' && c <= 'Z' ? c + 32 : c;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uint32_t)c < tokmap_lower[mid][0])
            hi = mid;
        else if ((uint32_t)c > tokmap_lower[mid][0])
            lo = mid + 1;
        else
            return (int32_t)tokmap_lower[mid][1];
    }
    return utf8proc_tolower(c);
}

/* Rust's char::is_whitespace (White_Space): what Strip removes. */
static bool
tokmap_is_space(int32_t c)
{
    if (c <= 0x20)
        return c == 0x20 || (c >= 0x09 && c <= 0x0D);
    if (c < 0x85)
        return false;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- Work buffers ---------------------------------------------------------- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} tokmap_cps_t;

/* The scratch of one normalization: code points ping-pong between a and b;
 * the result is the UTF-8 in out. */
typedef struct {
    tokmap_cps_t a, b;
    td_buf_t out;
} tokmap_work_t;

static td_status_t
tokmap_cps_reserve(tokmap_cps_t *c, size_t extra)
{
    if (c->cap - c->n >= extra)
        return TD_OK;
    size_t cap = c->cap ? c->cap : 64;
    while (cap - c->n < extra)
        cap *= 2;
    int32_t *v = realloc(c->v, cap * sizeof(*v));
    if (!v) {
        td_error("tokmap: out of memory (%zu code points)", cap);
        return TD_ERR_NOMEM;
    }
    c->v = v;
    c->cap = cap;
    return TD_OK;
}

static void
tokmap_work_free(tokmap_work_t *w)
{
    free(w->a.v);
    free(w->b.v);
    td_buf_free(&w->out);
}

static void
tokmap_work_swap(tokmap_work_t *w)
{
    tokmap_cps_t t = w->a;
    w->a = w->b;
    w->b = t;
}

/* ---- UTF-8 ------------------------------------------------------------------ */

/* Strict UTF-8 (what Rust's str holds: no overlong forms, no surrogates,
 * nothing above U+10FFFF) -> w->a. Not UTF-8: TD_ERR_INVALID, *bad = the
 * offset of the first byte of the first invalid sequence (nothing logged). */
static td_status_t
tokmap_decode(tokmap_work_t *w, const uint8_t *s, size_t len, size_t *bad)
{
    td_status_t st;

    w->a.n = 0;
    if ((st = tokmap_cps_reserve(&w->a, len)) != TD_OK)
        return st;
    for (size_t i = 0; i < len;) {
        uint32_t c = s[i], min;
        size_t k;

        if (c < 0x80) {
            w->a.v[w->a.n++] = (int32_t)c;
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 1, c &= 0x1F, min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2, c &= 0x0F, min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3, c &= 0x07, min = 0x10000;
        } else {
            *bad = i;
            return TD_ERR_INVALID;
        }
        if (len - i <= k) {
            *bad = i;
            return TD_ERR_INVALID;
        }
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) {
                *bad = i;
                return TD_ERR_INVALID;
            }
            c = c << 6 | (s[i + j] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
            *bad = i;
            return TD_ERR_INVALID;
        }
        w->a.v[w->a.n++] = (int32_t)c;
        i += k + 1;
    }
    return TD_OK;
}

/* w->a -> w->out as UTF-8. */
static td_status_t
tokmap_encode(tokmap_work_t *w)
{
    td_buf_truncate(&w->out, 0);
    if (td_buf_reserve(&w->out, 4 * w->a.n) != TD_OK) {
        td_error("tokmap: out of memory (%zu code points)", w->a.n);
        return TD_ERR_NOMEM;
    }
    for (size_t i = 0; i < w->a.n; i++) {
        uint8_t c[4];
        td_buf_append(&w->out, c, (size_t)utf8proc_encode_char(w->a.v[i], c));   /* room made */
    }
    return TD_OK;
}

/* ---- The normalizer --------------------------------------------------------- */

/* Canonical ordering of s[0..n): each run of non-starters sorted, stably, by
 * combining class. */
static void
tokmap_reorder(int32_t *s, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        int32_t c = s[i];
        int ccc = utf8proc_get_property(c)->combining_class;
        size_t j = i;

        if (ccc == 0)
            continue;
        while (j > 0) {
            int prev = utf8proc_get_property(s[j - 1])->combining_class;
            if (prev <= ccc)
                break;
            s[j] = s[j - 1];
            j--;
        }
        s[j] = c;
    }
}

/* w->a -> w->a in NFKC (compat) or NFD, with tokenizers' tables: a code point
 * they do not know is an unassigned starter, so the text is normalized in
 * pieces between such code points, which pass through. */
static td_status_t
tokmap_norm_form(tokmap_work_t *w, bool nfkc)
{
    const utf8proc_option_t dopt = UTF8PROC_DECOMPOSE | (nfkc ? UTF8PROC_COMPAT : 0);
    const int32_t *in = w->a.v;
    size_t n = w->a.n, i = 0;
    tokmap_cps_t *out = &w->b;
    td_status_t st;

    out->n = 0;
    while (i < n) {
        if (!tokmap_known(in[i])) {
            if ((st = tokmap_cps_reserve(out, 1)) != TD_OK)
                return st;
            out->v[out->n++] = in[i++];
            continue;
        }
        size_t seg = out->n;
        for (; i < n && tokmap_known(in[i]); i++) {
            utf8proc_ssize_t k = 0;
            size_t room = 32;   /* the longest decomposition is 18 code points */
            for (;;) {
                if ((st = tokmap_cps_reserve(out, room)) != TD_OK)
                    return st;
                k = utf8proc_decompose_char(in[i], out->v + out->n, (utf8proc_ssize_t)room,
                                            dopt, NULL);
                if (k < 0) {
                    td_error("tokmap: utf8proc cannot decompose U+%04X: %s", (unsigned)in[i],
                             utf8proc_errmsg(k));
                    return TD_ERR_INTERNAL;
                }
                if ((size_t)k <= room)
                    break;
                room = (size_t)k;
            }
            out->n += (size_t)k;
        }
        tokmap_reorder(out->v + seg, out->n - seg);
        if (nfkc) {
            utf8proc_ssize_t k = utf8proc_normalize_utf32(
                out->v + seg, (utf8proc_ssize_t)(out->n - seg), UTF8PROC_COMPOSE | UTF8PROC_STABLE);
            if (k < 0) {
                td_error("tokmap: utf8proc cannot compose: %s", utf8proc_errmsg(k));
                return TD_ERR_INTERNAL;
            }
            out->n = seg + (size_t)k;
        }
    }
    tokmap_work_swap(w);
    return TD_OK;
}

/* w->a (valid code points) -> w->out: the whole normalizer sequence. */
static td_status_t
tokmap_norm(tokmap_work_t *w)
{
    td_status_t st;
    int32_t max = 0;

    for (size_t i = 0; i < w->a.n; i++)
        if (w->a.v[i] > max)
            max = w->a.v[i];

    /* NFKC, NFD, StripAccents: nothing below U+00A0 decomposes or is a mark. */
    if (max >= 0xA0) {
        if ((st = tokmap_norm_form(w, true)) != TD_OK ||
            (st = tokmap_norm_form(w, false)) != TD_OK)
            return st;
        size_t k = 0;
        for (size_t i = 0; i < w->a.n; i++)
            if (!tokmap_is_mark(w->a.v[i]))
                w->a.v[k++] = w->a.v[i];
        w->a.n = k;
    }

    /* Lowercase, code point by code point (so no final sigma). The one code
     * point whose lower case is two, U+0130, never gets here: NFD made it
     * I U+0307 (tests/tokmap/mkucd checks that it is the only one). */
    for (size_t i = 0; i < w->a.n; i++)
        w->a.v[i] = tokmap_lower1(w->a.v[i]);

    /* Replace [ \t\r\n]+ -> " ". */
    size_t k = 0;
    bool run = false;
    for (size_t i = 0; i < w->a.n; i++) {
        int32_t c = w->a.v[i];
        bool sp = c == ' ' || c == '\t' || c == '\r' || c == '\n';
        if (!sp)
            w->a.v[k++] = c;
        else if (!run)
            w->a.v[k++] = ' ';
        run = sp;
    }
    w->a.n = k;

    /* Replace ^ $ -> sentinel (no '\n' is left, so only a text that is one
     * space matches), Strip, sentinel -> " " (every U+E000, the text's own too). */
    if (w->a.n == 1 && w->a.v[0] == ' ')
        w->a.v[0] = TOKMAP_SENTINEL;
    size_t lo = 0, hi = w->a.n;
    while (lo < hi && tokmap_is_space(w->a.v[lo]))
        lo++;
    while (hi > lo && tokmap_is_space(w->a.v[hi - 1]))
        hi--;
    k = 0;
    for (size_t i = lo; i < hi; i++)
        w->a.v[k++] = w->a.v[i] == TOKMAP_SENTINEL ? ' ' : w->a.v[i];
    w->a.n = k;

    return tokmap_encode(w);
}

td_status_t
td_tokmap_normalize(const char *s, size_t len, char **out, size_t *outlen)
{
    tokmap_work_t w = {0};
    td_status_t st;
    size_t bad = 0;

    if (!out || !outlen || (!s && len)) {
        td_error("tokmap: normalize: missing argument");
        return TD_ERR_INVALID;
    }
    st = tokmap_decode(&w, (const uint8_t *)s, len, &bad);
    if (st == TD_ERR_INVALID)
        td_error("tokmap: text of %zu bytes is not UTF-8 (byte %zu)", len, bad);
    if (st != TD_OK)
        goto err_free_work;
    if ((st = tokmap_norm(&w)) != TD_OK)
        goto err_free_work;
    *out = td_buf_take(&w.out, outlen);   /* not NULL: tokmap_encode made room */
    tokmap_work_free(&w);
    return TD_OK;

err_free_work:
    tokmap_work_free(&w);
    return st;
}

/* ---- The map ----------------------------------------------------------------- */

/* One class: its key's bytes in the arena. */
typedef struct {
    size_t off;
    uint32_t len;
} tokmap_key_t;

typedef struct {
    td_hmap_t *idx;         /* tokmap_hash of a key -> its class, several per hash */
    tokmap_key_t *keys;     /* [ids]: each class's key */
    td_buf_t arena;         /* the keys, one after another */
    uint32_t nclasses;
} tokmap_table_t;

static uint64_t
tokmap_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */

    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

/* The class of key (n bytes), a new one when it was not seen yet. */
static td_status_t
tokmap_table_class(tokmap_table_t *t, const char *key, size_t n, uint32_t *cls)
{
    uint64_t h = tokmap_hash(key, n), c;
    size_t pos = 0;

    while ((c = td_hmap_each(t->idx, h, &pos)) != TD_HMAP_NONE) {
        const tokmap_key_t *k = &t->keys[c];
        if (k->len == n && memcmp(t->arena.data + k->off, key, n) == 0) {
            *cls = (uint32_t)c;
            return TD_OK;
        }
    }
    size_t off = t->arena.len;
    if (td_buf_append(&t->arena, key, n) != TD_OK || td_hmap_add(t->idx, h, t->nclasses) != TD_OK) {
        td_error("tokmap: out of memory (%zu bytes of keys)", off + n);
        return TD_ERR_NOMEM;
    }
    t->keys[t->nclasses] = (tokmap_key_t){ .off = off, .len = (uint32_t)n };
    *cls = t->nclasses++;
    return TD_OK;
}

/* The key of one id (see tokmap.h), into *key / *n (pointing into w or tok). */
static td_status_t
tokmap_key(const td_tokenizer_t *tok, uint32_t id, tokmap_work_t *w, const char **key,
           size_t *n)
{
    const char *b;
    size_t len, bad;
    td_status_t st;

    st = td_tokenizer_piece(tok, id, &b, &len);
    if (st == TD_ERR_RANGE) {
        /* No token: decoding the id alone gives the empty text. */
        *key = "";
        *n = 0;
        return TD_OK;
    }
    if (st != TD_OK)
        return st;
    st = tokmap_decode(w, (const uint8_t *)b, len, &bad);
    if (st == TD_OK) {
        for (size_t i = 0; i < w->a.n; i++)
            if (w->a.v[i] == (int32_t)TOKMAP_FFFD) {
                st = TD_ERR_INVALID;
                break;
            }
    }
    if (st == TD_ERR_INVALID) {
        /* Decoded, the bytes hold U+FFFD (not UTF-8, or U+FFFD itself): the
         * raw vocabulary string is the key. */
        st = td_tokenizer_token(tok, id, key, n);
        if (st != TD_OK)
            td_error("tokmap: id %u has bytes but no vocabulary string: %s", id,
                     td_status_str(st));
        return st;
    }
    if (st != TD_OK || (st = tokmap_norm(w)) != TD_OK)
        return st;
    if (w->out.len == 0) {
        *key = b;   /* normalized to nothing: the text itself */
        *n = len;
    } else {
        *key = w->out.data;
        *n = w->out.len;
    }
    return TD_OK;
}

td_status_t
td_tokmap_build(const td_tokenizer_t *tok, uint32_t **map, uint32_t *nclasses)
{
    tokmap_table_t t = {0};
    tokmap_work_t w = {0};
    uint32_t *m = NULL;
    uint32_t v;
    td_status_t st;

    if (!tok || !map || !nclasses) {
        td_error("tokmap: build: missing argument");
        return TD_ERR_INVALID;
    }
    v = td_tokenizer_vocab_size(tok);
    m = malloc(((size_t)v + 1) * sizeof(*m));
    t.keys = malloc(((size_t)v + 1) * sizeof(*t.keys));   /* a class per id at most */
    if (!m || !t.keys || td_hmap_create((size_t)v + 1, &t.idx) != TD_OK) {
        td_error("tokmap: out of memory (map of %u ids)", v);
        st = TD_ERR_NOMEM;
        goto err_free;
    }

    for (uint32_t id = 0; id < v; id++) {
        const char *key;
        size_t n;
        if ((st = tokmap_key(tok, id, &w, &key, &n)) != TD_OK)
            goto err_free;
        if (n > UINT32_MAX) {
            td_error("tokmap: id %u: text of %zu bytes is too long", id, n);
            st = TD_ERR_TOO_BIG;
            goto err_free;
        }
        if ((st = tokmap_table_class(&t, key, n, &m[id])) != TD_OK)
            goto err_free;
    }
    *map = m;
    *nclasses = t.nclasses;
    m = NULL;
    st = TD_OK;

err_free:
    free(m);
    free(t.keys);
    td_hmap_destroy(t.idx);
    td_buf_free(&t.arena);
    tokmap_work_free(&w);
    return st;
}
